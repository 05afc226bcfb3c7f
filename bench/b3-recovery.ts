import { execFile } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import pLimit from "p-limit";
import { DOCKER_DEFAULT_URL } from "../src/docker/engine-endpoint.js";
import { bundleNodeFlags, freePort, SHIM_BUNDLE } from "../test/support/shim-process.js";
import { b3Rows, type B3Figures } from "./lib/b3-rows.js";
import { firstAnswer } from "./lib/first-answer.js";
import { compileFloor, runFloor, timeVersionPairs, type FloorMarks } from "./lib/floor.js";
import type { Bench } from "./lib/harness.js";
import { LOADED_MARGIN_MB, settledMemory } from "./b6-memory.js";
import { logTimes } from "./lib/log-times.js";
import type { Fleet } from "./lib/fleet.js";
import type { Row } from "./lib/report.js";
import { describe, median, round } from "./lib/stats.js";

/** The label of every task container (the shim lists by it). */
const TASK_LABEL = "ai.dstack.shim.is-task=true";
/** Runs of the physical floor, and pairs of `--version` and `node -e 0`, per B3 run. */
const FLOOR_RUNS = 5;
const VERSION_PAIRS = 10;
/** The bundle the run's shims start from (`BENCH_SHIM_BUNDLE`, as the harness's). */
const BUNDLE = process.env.BENCH_SHIM_BUNDLE || SHIM_BUNDLE;

/** What the first answer of the restarted shim showed, and where the time went. */
interface Trial {
  readonly ms: number;
  /** spawn → the "tasks restored" log line (boot, engine ping, GPU probe, state scan, list, inspects). */
  readonly restoreMs: number;
  /** "tasks restored" → "taskshim serving" (host keys, first reconcile tick, components, listen). */
  readonly readyMs: number;
  readonly problems: string[];
}

/**
 * One trial: `kill -9` the fleet's shim, SIGKILL `victims` containers while it is down (Docker
 * reports them exited before the restart), restart it on the same home and port, and time
 * spawn → the first `GET /api/tasks` answer. That first answer must already list every task,
 * the survivors `running` and the victims `terminated` — exits while down are final before
 * the first request is served.
 */
async function trial(bench: Bench, fleet: Fleet, victimsCount: number, binary?: string): Promise<Trial> {
  const old = fleet.shim;
  const victims = await fleet.takeVictims(victimsCount);
  await bench.killShim(old);
  await fleet.killContainers(victims.containers);

  const started = performance.now();
  // The shim dates its log lines by the wall clock: so is the spawn (performance.timeOrigin plus
  // the monotonic clock drifts from it, by ~15 ms in 3 s on this VM while NTP slews it).
  const startedWall = Date.now();
  const shim = await bench.startShim({
    home: old.home,
    port: old.port,
    waitReady: false,
    ...(binary !== undefined ? { binary } : {}),
  });
  fleet.shim = shim;
  const first = await firstAnswer(shim, 30_000);
  const ms = first.at - started;
  const restored = logTimes(shim.logs, "tasks restored")[0] ?? Number.NaN;
  const restoreMs = restored - startedWall;
  const readyMs = (logTimes(shim.logs, "taskshim serving")[0] ?? Number.NaN) - restored;

  const problems: string[] = [];
  const wrong = fleet.running.filter((id) => first.tasks.get(id) !== "running");
  if (wrong.length > 0)
    problems.push(`${wrong.length} running tasks missing or not running (${wrong.slice(0, 3).join(", ")})`);
  const open = victims.ids.filter((id) => first.tasks.get(id) !== "terminated");
  if (open.length > 0) problems.push(`${open.length} tasks that exited while down not terminated at once`);
  for (const id of victims.ids) {
    const task = await shim.task(id);
    if (task.termination_reason !== "container_exited_with_error")
      problems.push(`${id}: ${task.termination_reason} instead of container_exited_with_error`);
  }
  return { ms, restoreMs, readyMs, problems };
}

const execFileAsync = promisify(execFile);

/**
 * Reference figures for the restore path, from the same run: how long node takes to load the
 * shim's bundle (`taskshim --version`), one labelled container list, and how long the engine
 * takes to answer one inspect per fleet container, one at a time and 16 at a time. Returns the
 * old floor of a restart: the bare start plus one list (medians of 5). It holds most of the
 * shim's own start (its bundle, commander, the builtins it loads), so B3 is also reported against
 * the physical floor ({@link measureFloor}); this one is kept so that runs compare across the change.
 */
async function explainRestore(bench: Bench, fleet: Fleet): Promise<number> {
  const boots: number[] = [];
  const lists: number[] = [];
  const flags = bundleNodeFlags(BUNDLE);
  for (let i = 0; i < 5; i++) {
    let started = performance.now();
    await execFileAsync(process.execPath, [...flags, BUNDLE, "--version"]);
    boots.push(performance.now() - started);
    started = performance.now();
    await bench.docker.listContainers({ all: true, filters: { label: [TASK_LABEL] } });
    lists.push(performance.now() - started);
  }
  const ids = (await bench.ownContainers()).filter((c) => c.State === "running").map((c) => c.Id);
  let started = performance.now();
  for (const id of ids) await bench.docker.getContainer(id).inspect();
  const sequential = performance.now() - started;
  started = performance.now();
  await pLimit(16).map(ids, (id) => bench.docker.getContainer(id).inspect());
  const parallel = performance.now() - started;
  bench.note(
    `B3 reference: node + bundle load (taskshim --version) ${round(median(boots), 0)} ms; ` +
      `one labelled container list ${round(median(lists), 0)} ms; ` +
      `${ids.length} inspects one at a time ${round(sequential, 0)} ms, 16 at a time ${round(parallel, 0)} ms ` +
      `(fleet shim has ${fleet.running.length} running tasks)`,
  );
  return median(boots) + median(lists);
}

/**
 * The physical floor and the `--version` pair, in a window where the fleet's shim is down as in a
 * trial (`kill -9`, its containers running; no CPU of its own taken from the floor), then the
 * shim is restarted on the same home and port for what follows (B8). The floor reads the home
 * B3 restarts, and its every answer must list each running task of the fleet as running.
 */
async function measureFloor(
  bench: Bench,
  fleet: Fleet,
  binary: string | undefined,
): Promise<Pick<B3Figures, "floor" | "versionPairs">> {
  const script = await compileFloor(await bench.tempDir("taskshim-bench-floor-"));
  const old = fleet.shim;
  await bench.killShim(old);
  const times: number[] = [];
  const marks: FloorMarks[] = [];
  const problems: string[] = [];
  let versionPairs: B3Figures["versionPairs"];
  try {
    for (let i = 0; i < FLOOR_RUNS; i++) {
      const run = await runFloor(script, {
        engineUrl: bench.engine.url ?? DOCKER_DEFAULT_URL,
        home: old.home,
        port: await freePort(),
      });
      times.push(run.ms);
      marks.push(run.marks);
      const wrong = fleet.running.filter((id) => run.tasks.get(id) !== "running");
      if (wrong.length > 0)
        problems.push(`run ${i + 1}: ${wrong.length} running tasks missing or not running`);
    }
    versionPairs = await timeVersionPairs(BUNDLE, VERSION_PAIRS, binary);
  } finally {
    fleet.shim = await bench.startShim({ home: old.home, port: old.port });
  }
  const ms = (pick: (m: FloorMarks) => number): string => `${round(median(marks.map(pick)), 0)}`;
  bench.note(
    `B3-floor spawn → first answer ${times.map((t) => round(t, 0)).join("/")} ms; inside the floor ` +
      `(medians, ms since its start): script ${ms((m) => m.script)}, list ${ms((m) => m.listed)}, ` +
      `${marks[0]?.files ?? 0} task.json read ${ms((m) => m.read)}, listening ${ms((m) => m.listening)}, ` +
      `answered ${ms((m) => m.answered)}` +
      (problems.length > 0
        ? `; PROBLEMS: ${problems.join("; ")}`
        : "; every answer listed the fleet running"),
  );
  bench.note(
    `B3-version taskshim --version: bundle ${describe(versionPairs.version, " ms", 0)}` +
      (versionPairs.binary ? `, single binary ${describe(versionPairs.binary, " ms", 0)}` : "") +
      `; node -e 0 ${describe(versionPairs.bare, " ms", 0)}`,
  );
  return { floor: { times, files: marks[0]?.files ?? 0, problems }, versionPairs };
}

/**
 * B3: recovery from `kill -9` with the fleet running: restart → the API serves every task,
 * with the exits that happened while the shim was down already final. Each trial first tops
 * the fleet back up to its size. The bundle's trials (`node dist/taskshim.cjs`, as `npm start`)
 * and, given `binary`, the single binary's (as released: from its startup snapshot) take turns.
 * Median over trials, against two floors of the same run (the old one, and the physical one of
 * bench/b3-floor.ts), and the `--version` rounds.
 */
export async function runB3(
  bench: Bench,
  fleet: Fleet,
  size: number,
  binary: string | undefined,
  idleRss: number,
): Promise<Row[]> {
  const trials = bench.quick ? 2 : 3;
  const victims = bench.quick ? 3 : 10;
  // The bundle's trial last: its shim, left serving, is the one whose memory is read below.
  const forms = [...(binary !== undefined ? [binary] : []), undefined];
  const results = new Map<string | undefined, Trial[]>(forms.map((form) => [form, []]));
  for (let t = 0; t < trials; t++) {
    for (const form of forms) {
      await fleet.grow(size);
      await sleep(1_500);
      results.get(form)?.push(await trial(bench, fleet, victims, form));
    }
  }
  const ms3 = (values: number[]): string => values.map((v) => round(v, 0)).join("/");
  const summary = (form: string | undefined): { times: number[]; problems: string[] } => {
    const done = results.get(form) ?? [];
    const times = done.map((r) => r.ms);
    const problems = done.flatMap((r) => r.problems);
    bench.note(
      `B3 restart (${form === undefined ? "bundle" : "single binary"}) → serving ${size} tasks ` +
        `(${victims} exited while down): ${ms3(times)} ms ` +
        `= spawn → "tasks restored" ${ms3(done.map((r) => r.restoreMs))} ms + ` +
        `→ "taskshim serving" ${ms3(done.map((r) => r.readyMs))} ms + first answer` +
        (problems.length > 0 ? `; PROBLEMS: ${problems.join("; ")}` : "; every first answer was complete"),
    );
    return { times, problems };
  };
  const ofBundle = summary(undefined);
  const ofBinary = binary !== undefined ? summary(binary) : undefined;
  // The restarted shim's memory once settled, serving the fleet (B6's own method, B6's target).
  const restarted = await settledMemory(fleet.shim);
  bench.note(
    `B3 RSS of the restarted shim (bundle) serving ${size} tasks: ${restarted.rss} MB ` +
      `(${restarted.settled ? "settled" : "not settled"}: ${restarted.span} MB apart over ${restarted.sampledS} s)`,
  );
  const oldFloorMs = await explainRestore(bench, fleet);
  const measured = await measureFloor(bench, fleet, binary);
  return b3Rows({
    size,
    victims,
    ...ofBundle,
    oldFloorMs,
    ...measured,
    ...(ofBinary ? { binary: ofBinary } : {}),
    memory: { rss: restarted.rss, idleRss, marginMb: LOADED_MARGIN_MB },
  });
}
