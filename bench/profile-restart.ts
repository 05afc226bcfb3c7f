import { mkdir, readdir, readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Bench } from "./lib/harness.js";
import { Fleet } from "./lib/fleet.js";
import { logTimes } from "./lib/log-times.js";
import { median, round } from "./lib/stats.js";

/*
 * `npx tsx bench/profile-restart.ts [--tasks 200] [--runs 5] [--min-ms 10] [--out DIR] [--binary FILE]
 *   [--interval-us 1000] [--victims 0]`
 *
 * Where a restart's CPU goes (B3): grows a fleet of running tasks on one shim, then `--runs` times
 * `kill -9`s it, restarts it on the same home under `--cpu-prof` and stops it gracefully once it
 * logs "taskshim serving" (a profile is only written on a clean exit). Prints what ran before that
 * line, as the median over the runs (a sampled profile on a shared machine is noisy): self time
 * per function and inclusive time per frame, every item of at least `--min-ms`. Same set-up and
 * clean-up as `npm run bench` (everything named `bn-<nonce>-…`). `--binary`: restart as that single
 * binary (`dist/taskshim` of `npm run build:binary`), which takes `--cpu-prof` from NODE_OPTIONS too.
 * `--interval-us`: V8's sampling interval (finer shows short phases, at some cost to the run).
 * `--victims`: containers SIGKILLed while the shim is down, as B3 does (their exits are finalized
 * before it serves); the fleet is grown back after each run.
 */

/** A pause after the fleet is grown back: the engine's work for the new containers ends before the next restart. */
const SETTLE_MS = 1_500;

/** One node of a V8 `.cpuprofile`. */
interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly children?: readonly number[];
}

/** A V8 `.cpuprofile` as `--cpu-prof` writes it (times in µs). */
interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

/** Self and inclusive ms per frame label, over the samples of the first `untilMs` of the profile. */
function summarise(
  profile: CpuProfile,
  untilMs: number,
): { self: Map<string, number>; total: Map<string, number> } {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const label = (node: ProfileNode): string => {
    const { functionName, url, lineNumber } = node.callFrame;
    const file = url.split("/").at(-1) ?? "";
    return `${functionName || "(anonymous)"} ${file ? `${file}:${lineNumber + 1}` : ""}`.trim();
  };
  const self = new Map<string, number>();
  const total = new Map<string, number>();
  let elapsedUs = 0;
  profile.samples.forEach((id, index) => {
    elapsedUs += profile.timeDeltas[index] ?? 0;
    if (elapsedUs > untilMs * 1000) return;
    const ms = (profile.timeDeltas[index + 1] ?? 0) / 1000;
    const leaf = byId.get(id);
    if (!leaf) return;
    self.set(label(leaf), (self.get(label(leaf)) ?? 0) + ms);
    // Inclusive: every distinct frame label on the stack once (recursion counted once).
    const seen = new Set<string>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const node = byId.get(at);
      if (!node) break;
      const name = label(node);
      if (seen.has(name)) continue;
      seen.add(name);
      total.set(name, (total.get(name) ?? 0) + ms);
    }
  });
  return { self, total };
}

/** The median of each label over the runs (a run without the label counts 0). */
function medians(runs: readonly Map<string, number>[]): Map<string, number> {
  const labels = new Set(runs.flatMap((run) => [...run.keys()]));
  return new Map([...labels].map((label) => [label, median(runs.map((run) => run.get(label) ?? 0))]));
}

const table = (title: string, values: Map<string, number>, minMs: number): string =>
  [
    `| ${title} | ms |`,
    "| --- | ---: |",
    ...[...values]
      .filter(([, ms]) => ms >= minMs)
      .sort((a, b) => b[1] - a[1])
      .map(([name, ms]) => `| \`${name}\` | ${round(ms, 1)} |`),
  ].join("\n");

const { values } = parseArgs({
  options: {
    tasks: { type: "string", default: "200" },
    runs: { type: "string", default: "5" },
    "min-ms": { type: "string", default: "10" },
    out: { type: "string" },
    binary: { type: "string" },
    "interval-us": { type: "string", default: "1000" },
    victims: { type: "string", default: "0" },
  },
});
const size = Number(values.tasks);
const runs = Number(values.runs);
const minMs = Number(values["min-ms"]);
const victims = Number(values.victims);
const bench = new Bench(false);
try {
  await bench.setup();
  const fleet = new Fleet(bench, await bench.startShim());
  bench.log(`growing a fleet of ${size}`);
  await fleet.grow(size);
  const out = values.out ?? (await bench.tempDir("taskshim-cpuprof-"));
  const self: Map<string, number>[] = [];
  const total: Map<string, number>[] = [];
  const serving: number[] = [];
  for (let run = 0; run < runs; run++) {
    const taken = await fleet.takeVictims(victims);
    await bench.killShim(fleet.shim);
    await fleet.killContainers(taken.containers);
    const dir = join(out, `run-${run}`);
    await mkdir(dir, { recursive: true });
    const spawned = Date.now(); // as the shim dates its log lines (wallMs drifts from it)
    fleet.shim = await bench.startShim({
      home: fleet.shim.home,
      port: fleet.shim.port,
      env: { NODE_OPTIONS: `--cpu-prof --cpu-prof-interval=${values["interval-us"]} --cpu-prof-dir=${dir}` },
      ...(values.binary !== undefined ? { binary: values.binary } : {}),
    });
    serving.push((logTimes(fleet.shim.logs, "taskshim serving")[0] ?? Number.NaN) - spawned);
    await bench.stopShim(fleet.shim);
    // Served again without the profiler: the next run's victims are taken through its API.
    fleet.shim = await bench.startShim({ home: fleet.shim.home, port: fleet.shim.port });
    if (victims > 0) {
      await bench.removeTasks(fleet.shim, taken.ids);
      await fleet.grow(size);
      await sleep(SETTLE_MS);
    }
    const file = (await readdir(dir)).find((f) => f.endsWith(".cpuprofile"));
    if (!file) throw new Error(`no .cpuprofile in ${dir}`);
    const summary = summarise(
      JSON.parse(await readFile(join(dir, file), "utf8")) as CpuProfile,
      serving[run] ?? 0,
    );
    self.push(summary.self);
    total.push(summary.total);
  }
  console.log(
    `restart with ${size} running tasks, ${runs} runs: spawn → "taskshim serving" ` +
      `${serving.map((ms) => round(ms, 0)).join("/")} ms (profiles in ${out})\n`,
  );
  console.log(table("self time (median)", medians(self), minMs));
  console.log();
  console.log(table("inclusive time (median)", medians(total), minMs));
  await bench.removeTasks(fleet.shim, fleet.running);
} finally {
  await bench.cleanup();
}
