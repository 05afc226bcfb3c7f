import { execFile } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import pLimit from "p-limit";
import { bundleNodeFlags, SHIM_BUNDLE, type ShimProcess } from "../test/support/shim-process.js";
import { wallMs, type Bench } from "./lib/harness.js";
import { logTimes } from "./lib/log-times.js";
import type { Fleet } from "./lib/fleet.js";
import type { Row } from "./lib/report.js";
import { median, round } from "./lib/stats.js";

const TARGET_MS = 2_000;
/** Restart → serving all, at most this many times the bare start plus one container list. */
/**
 * With socket activation and `supervise` no request is refused during a restart (B8), so this is
 * latency, not loss: at most twice its floor.
 */
const FLOOR_RATIO_TARGET = 2.0;
/** The label of every task container (the shim lists by it). */
const TASK_LABEL = "ai.dstack.shim.is-task=true";
/**
 * The restarted shim is polled this often (a refused connection costs little, but the booting
 * shim needs the CPU); the first answer is dated midway between the previous attempt and it.
 */
const POLL_MS = 10;

/** What the first answer of the restarted shim showed, and where the time went. */
interface Trial {
  readonly ms: number;
  /** spawn → the "tasks restored" log line (boot, engine ping, GPU probe, state scan, list, inspects). */
  readonly restoreMs: number;
  /** "tasks restored" → "taskshim serving" (host keys, first reconcile tick, components, listen). */
  readonly readyMs: number;
  readonly problems: string[];
}

/** The first 200 answer of `GET /api/tasks/`, and when it came (performance.now()). */
async function firstAnswer(
  shim: ShimProcess,
  timeoutMs: number,
): Promise<{ at: number; tasks: Map<string, string> }> {
  const deadline = performance.now() + timeoutMs;
  let previous = performance.now();
  while (performance.now() < deadline) {
    if (shim.child.exitCode !== null) throw new Error(`restarted shim exited:\n${shim.logs}`);
    try {
      const sent = performance.now();
      const response = await fetch(`${shim.url}/api/tasks`, { signal: AbortSignal.timeout(5_000) });
      const at = (previous + performance.now()) / 2;
      previous = sent;
      if (response.status === 200) {
        const body = (await response.json()) as { tasks: { id: string; status: string }[] };
        return { at, tasks: new Map(body.tasks.map((t) => [t.id, t.status])) };
      }
      await response.body?.cancel();
    } catch {
      // not listening yet
      previous = performance.now();
    }
    await sleep(POLL_MS);
  }
  throw new Error(`restarted shim did not serve within ${timeoutMs} ms:\n${shim.logs}`);
}

/**
 * One trial: `kill -9` the fleet's shim, SIGKILL `victims` containers while it is down (Docker
 * reports them exited before the restart), restart it on the same home and port, and time
 * spawn → the first `GET /api/tasks` answer. That first answer must already list every task,
 * the survivors `running` and the victims `terminated` — exits while down are final before
 * the first request is served.
 */
async function trial(bench: Bench, fleet: Fleet, victimsCount: number): Promise<Trial> {
  const old = fleet.shim;
  const victims = await fleet.takeVictims(victimsCount);
  await bench.killShim(old);
  await fleet.killContainers(victims.containers);

  const started = performance.now();
  const startedWall = wallMs();
  const shim = await bench.startShim({ home: old.home, port: old.port, waitReady: false });
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
 * floor of a restart: the bare start plus one list (medians of 5), below which no restart that
 * must ask the engine what runs can go.
 */
async function explainRestore(bench: Bench, fleet: Fleet): Promise<number> {
  const boots: number[] = [];
  const lists: number[] = [];
  const bundle = process.env.BENCH_SHIM_BUNDLE || SHIM_BUNDLE;
  const flags = bundleNodeFlags(bundle);
  for (let i = 0; i < 5; i++) {
    let started = performance.now();
    await execFileAsync(process.execPath, [...flags, bundle, "--version"]);
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
 * B3: recovery from `kill -9` with the fleet running: restart → the API serves every task,
 * with the exits that happened while the shim was down already final. Each trial first tops
 * the fleet back up to its size. Median over trials.
 */
export async function runB3(bench: Bench, fleet: Fleet, size: number): Promise<Row[]> {
  const trials = bench.quick ? 2 : 3;
  const victims = bench.quick ? 3 : 10;
  const results: Trial[] = [];
  for (let t = 0; t < trials; t++) {
    await fleet.grow(size);
    await sleep(1_500);
    results.push(await trial(bench, fleet, victims));
  }
  const times = results.map((r) => r.ms);
  const problems = results.flatMap((r) => r.problems);
  const ms3 = (values: number[]): string => values.map((v) => round(v, 0)).join("/");
  bench.note(
    `B3 restart → serving ${size} tasks (${victims} exited while down): ${ms3(times)} ms ` +
      `= spawn → "tasks restored" ${ms3(results.map((r) => r.restoreMs))} ms + ` +
      `→ "taskshim serving" ${ms3(results.map((r) => r.readyMs))} ms + first answer` +
      (problems.length > 0 ? `; PROBLEMS: ${problems.join("; ")}` : "; every first answer was complete"),
  );
  const floor = await explainRestore(bench, fleet);
  const ms = round(median(times), 0);
  const ratio = round(median(times) / floor, 2);
  return [
    {
      id: "B3",
      name:
        `recovery: kill -9 with ${size} running tasks, restart → API serves all ` +
        `(${victims} exits while down final at once), median of ${trials}`,
      unit: "ms",
      taskshim: ms,
      baseline: null,
      ratio: null,
      target: "<= 2 s; exits while down final before the first answer",
      pass: ms <= TARGET_MS && problems.length === 0,
    },
    {
      id: "B3",
      name:
        `recovery time above ÷ its floor in the same run: bare start (taskshim --version) ` +
        `+ one labelled container list = ${round(floor, 0)} ms`,
      unit: "ratio",
      taskshim: ratio,
      baseline: null,
      ratio: null,
      target: `<= ${FLOOR_RATIO_TARGET}`,
      pass: ratio <= FLOOR_RATIO_TARGET,
    },
  ];
}
