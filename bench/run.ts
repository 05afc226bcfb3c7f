import { execFileSync } from "node:child_process";
import { cpus, loadavg } from "node:os";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { runB1 } from "./b1-submit-latency.js";
import { runB2 } from "./b2-exit-detection.js";
import { runB3 } from "./b3-recovery.js";
import { noteIdleCpu, runB4 } from "./b4-steady-state.js";
import { runB5 } from "./b5-api-throughput.js";
import { notePeakRss, runB6Cycles, runB6Idle, runB6Loaded } from "./b6-memory.js";
import { runB7 } from "./b7-burst.js";
import { runB8 } from "./b8-upgrade-window.js";
import { runB9 } from "./b9-fleet-rollout.js";
import { runB10 } from "./b10-event-fanout.js";
import {
  checkEngine,
  engineTarget,
  engineVersion,
  parseEngines,
  PER_ENGINE,
  type EngineKind,
} from "./lib/engines.js";
import { Bench, sweepStale } from "./lib/harness.js";
import { Fleet } from "./lib/fleet.js";
import { dockerdPid } from "./lib/proc.js";
import {
  compareRows,
  markdownTable,
  onEngine,
  writeResults,
  writeRunRecord,
  type Row,
} from "./lib/report.js";
import { round } from "./lib/stats.js";
import { VERSION } from "../src/version.js";
import { buildRolloutBinaries } from "./lib/supervised.js";

/*
 * `npm run bench -- [--quick] [--only B1,B5] [--engines docker,podman] [--tasks N] [--shims N] [--strict]`,
 * `npx tsx bench/run.ts --sweep [--engines docker,podman]`
 *
 * Runs the benchmarks of BENCHMARKS.md against the built shim (dist/taskshim.cjs) and the local
 * Docker Engine (B1 and B2 also on Podman with `--engines docker,podman`: rows B1-podman…),
 * prints a markdown table on stdout (progress goes to stderr) and writes
 * bench/results/latest.json (a full-size run of a committed source also bench/results/runs/<date>-<commit>.json,
 * or runs/partial/ for `--only`, kept for bench/medians.ts). Everything a run creates is named `bn-<nonce>-…` and removed at
 * the end, also on failure or Ctrl-C.
 */

const RESULTS = resolve(import.meta.dirname, "results/latest.json");
/** Full runs of committed sources, kept in the repository (`bench/medians.ts` reads them). */
const RUNS = resolve(import.meta.dirname, "results/runs");
/** Partial runs of committed sources (`--only`), kept apart: `bench/medians.ts --only` reads them. */
const PARTIAL_RUNS = resolve(RUNS, "partial");
const ALL = ["B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10"] as const;

const { values } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    only: { type: "string" },
    strict: { type: "boolean", default: false },
    sweep: { type: "boolean", default: false },
    tasks: { type: "string" },
    shims: { type: "string" },
    engines: { type: "string" },
  },
});

let engines: EngineKind[];
try {
  engines = parseEngines(values.engines);
} catch (error) {
  process.stderr.write(`--engines: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(2);
}

const selected = new Set(
  values.only
    ? values.only
        .toUpperCase()
        .split(",")
        .map((s) => s.trim())
    : ALL,
);
const unknown = [...selected].filter((id) => !(ALL as readonly string[]).includes(id));
if (unknown.length > 0) {
  process.stderr.write(`unknown benchmark(s): ${unknown.join(", ")} (use ${ALL.join(",")})\n`);
  process.exit(2);
}

// Only B1 and B2 run on every engine of the run; the rest need Docker (their fleet, B8/B9's binaries).
const dockerOnly = [...selected].filter((id) => !PER_ENGINE.has(id));
if (!values.sweep && !engines.includes("docker") && dockerOnly.length > 0) {
  process.stderr.write(
    `${dockerOnly.join(", ")} run on Docker only: add docker to --engines, or --only ${[...PER_ENGINE].join(",")}\n`,
  );
  process.exit(2);
}

// Docker's Bench (the first engine's) is the run; the others are views of it (same nonce, notes, cleanup).
const bench = new Bench(values.quick, engineTarget(engines[0]!));
const benches = engines.map((kind) => (kind === bench.engine.kind ? bench : bench.on(engineTarget(kind))));
if (values.sweep) {
  for (const each of benches) {
    const removed = await sweepStale(each.docker);
    process.stderr.write(`removed ${removed} bn- containers of earlier runs on ${each.engine.label}\n`);
  }
  process.exit(0);
}
const fleetSize = values.tasks ? Number(values.tasks) : bench.quick ? 50 : 200;
if (!Number.isInteger(fleetSize) || fleetSize < 10) {
  process.stderr.write(`--tasks: expected an integer >= 10\n`);
  process.exit(2);
}

const shimCount = values.shims ? Number(values.shims) : bench.quick ? 10 : 30;
if (!Number.isInteger(shimCount) || shimCount < 1) {
  process.stderr.write(`--shims: expected an integer >= 1\n`);
  process.exit(2);
}

let cleaning: Promise<void> | undefined;
const cleanup = (): Promise<void> => (cleaning ??= bench.cleanup());
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    bench.log(`${signal}: cleaning up`);
    void cleanup().finally(() => process.exit(130));
  });
}
process.once("exit", () => bench.killAllNow());

/** What the shim under test was built from: a bundle given, or a commit and whether src/ had changes. */
interface ShimRevision {
  readonly bundle?: string;
  readonly commit?: string;
  readonly dirty: boolean;
}

function shimRevision(): ShimRevision {
  const bundle = process.env.BENCH_SHIM_BUNDLE;
  if (bundle) return { bundle, dirty: false };
  try {
    const git = (args: string[]): string => execFileSync("git", args, { encoding: "utf8" }).trim();
    return {
      commit: git(["rev-parse", "--short", "HEAD"]),
      dirty: git(["status", "--porcelain", "--", "src"]) !== "",
    };
  } catch {
    return { dirty: false };
  }
}

function describeRevision({ bundle, commit, dirty }: ShimRevision): string {
  if (bundle) return `shim bundle ${bundle} (BENCH_SHIM_BUNDLE)`;
  if (!commit) return "shim built from an unknown revision";
  return `shim built from ${commit}${dirty ? " plus uncommitted changes in src/" : ""}`;
}

/** The engines measured and their versions, for the heading of the results. */
let engineVersions = "";

async function main(): Promise<Row[]> {
  const rows: Row[] = [];
  for (const each of benches) {
    await checkEngine(each.engine);
    await each.setup();
  }
  const versions = await Promise.all(
    benches.map(async (each) => `${each.engine.label} ${await engineVersion(each.engine)}`),
  );
  bench.log(`run ${bench.nonce}: ${bench.quick ? "quick" : "full"}, ${[...selected].join(" ")}`);
  engineVersions = versions.join(", ");
  const timed = async (id: string, fn: () => Promise<Row[]>, on: Bench = bench): Promise<void> => {
    if (!selected.has(id)) return;
    const started = performance.now();
    const label = on.engine.kind === "docker" ? id : `${id} on ${on.engine.label}`;
    bench.log(`${label}…`);
    rows.push(...onEngine(await fn(), on.engine));
    bench.log(`${label} done in ${Math.round((performance.now() - started) / 1000)} s`);
  };

  // B1 and B2 on each engine of the run, one engine after the other, each against its own baseline.
  for (const each of benches) await timed("B1", () => runB1(each), each);
  for (const each of benches) await timed("B2", () => runB2(each), each);
  await timed("B7", () => runB7(bench));
  await timed("B10", () => runB10(bench));

  // B8 and B9 roll single binaries A and B out (built here from the pinned Node.js); B3 also
  // restarts as A.
  const binaries = ["B3", "B8", "B9"].some((id) => selected.has(id))
    ? await buildRolloutBinaries(bench)
    : undefined;
  // B9's shims come and go before the fleet of B3–B6/B8 is grown.
  if (binaries) await timed("B9", () => runB9(bench, shimCount, binaries));

  // B6's cycles run on a shim of their own, stopped before the fleet is grown: the fleet row then
  // measures what 200 tasks cost, not what 10,000 cycles before them left behind.
  // The slope's later cycles are 9,000 in a full run (minutes): quick runs do a few hundred.
  await timed("B6", () => runB6Cycles(bench, bench.quick ? 200 : 1_000, bench.quick ? 400 : 9_000));

  if (["B3", "B4", "B5", "B6", "B8"].some((id) => selected.has(id))) {
    // One shim with the fleet of running tasks serves B6, B4, B5 and B3, in that order:
    // memory before any load, the quiet reconciler before the HTTP load, the kill -9 last.
    const fleet = new Fleet(bench, await bench.startShim());
    let idleRss = Number.NaN;
    await timed("B6", async () => {
      const idle = await runB6Idle(bench, fleet.shim);
      idleRss = idle.taskshim;
      return [idle];
    });
    if (selected.has("B4")) await noteIdleCpu(bench, fleet.shim, bench.quick ? 4_000 : 15_000);
    const started = performance.now();
    bench.log(`fleet: starting ${fleetSize} tasks`);
    await fleet.grow(fleetSize);
    bench.log(`fleet: ${fleetSize} running in ${Math.round((performance.now() - started) / 1000)} s`);
    await timed("B6", async () => [await runB6Loaded(bench, fleet.shim, fleetSize, idleRss)]);
    await timed("B4", () => runB4(bench, fleet));
    if (selected.has("B5")) await fleet.grow(fleetSize); // B4 killed a few
    await timed("B5", () => runB5(bench, fleet));
    if (selected.has("B6")) await notePeakRss(bench, fleet.shim);
    await timed("B3", () => runB3(bench, fleet, fleetSize, binaries?.A.path, idleRss));
    if (binaries) await timed("B8", () => runB8(bench, fleet, fleetSize, binaries));
  }
  return rows.sort(compareRows);
}

const started = performance.now();
// A dockerd restart stops Docker's containers; Podman's outlive its service (conmon holds them).
const onDocker = engines.includes("docker");
const engineAtStart = onDocker ? await dockerdPid() : undefined;
const revision = shimRevision();
const built = describeRevision(revision);
let rows: Row[] = [];
let failed: Error | undefined;
let leftovers = false;
try {
  rows = await main();
} catch (error) {
  failed = error instanceof Error ? error : new Error(String(error));
} finally {
  await cleanup().catch((error: unknown) => {
    leftovers = true;
    bench.log(
      `cleanup failed (${String(error)}): run \`npx tsx bench/run.ts --sweep\` to remove bn- leftovers`,
    );
  });
}
const engineAtEnd = onDocker ? await dockerdPid() : undefined;
const restarted =
  engineAtStart !== engineAtEnd
    ? `dockerd was restarted during the run (pid ${engineAtStart} → ${engineAtEnd}): its containers were stopped`
    : undefined;
if (failed !== undefined) {
  process.stderr.write(`benchmark failed: ${failed.stack ?? failed.message}\n`);
  if (restarted) process.stderr.write(`${restarted}; run it again.\n`);
  process.exit(1);
}
if (restarted) bench.note(`WARNING: ${restarted}; these results are not valid.`);

const seconds = Math.round((performance.now() - started) / 1000);
await writeResults(RESULTS, rows);
// Only a run of a committed source, at full size, is kept: the runs that medians may be taken
// over. A partial one (`--only`) goes apart, with the benchmarks it ran.
const fullSize = !bench.quick && !values.tasks && !values.shims;
const only = values.only ? [...selected].sort() : undefined;
const record =
  fullSize && revision.commit && !revision.dirty && !restarted
    ? await writeRunRecord(only ? PARTIAL_RUNS : RUNS, {
        date: new Date().toISOString(),
        version: VERSION,
        commit: revision.commit,
        node: process.version,
        engines: engineVersions,
        cpus: cpus().length,
        load: loadavg().map((l) => round(l, 2)),
        seconds,
        rows,
        notes: bench.notes,
        ...(only ? { only } : {}),
      })
    : undefined;
const passed = rows.filter((r) => r.pass).length;
process.stdout.write(
  [
    `## taskshim benchmarks (${bench.quick ? "quick: fewer tasks and trials" : "full"}; fleet of ${fleetSize} tasks; ${engineVersions})`,
    "",
    `${built}; ${cpus().length} CPUs, load average at the end ${loadavg()
      .map((l) => l.toFixed(1))
      .join(" ")}.`,
    "",
    markdownTable(rows),
    "",
    ...bench.notes.map((n) => `- ${n}`),
    "",
    `${passed}/${rows.length} targets met; ${seconds} s; results in ${RESULTS}${record ? ` and ${record}` : ""}`,
    "",
  ].join("\n"),
);
if (leftovers || (values.strict && passed < rows.length)) process.exit(1);
