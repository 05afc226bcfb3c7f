import { setTimeout as sleep } from "node:timers/promises";
import type { ShimProcess } from "../test/support/shim-process.js";
import type { Bench } from "./lib/harness.js";
import { residentBreakdown, statusMB } from "./lib/proc.js";
import { parsePrometheus, sumOf } from "./lib/prometheus.js";
import type { Row } from "./lib/report.js";
import { median, round } from "./lib/stats.js";

/**
 * Memory targets (BENCHMARKS.md): idle; with the fleet, at most idle + LOADED_MARGIN_MB; growth
 * after submit → exit → remove cycles; and the slope: what the later cycles add to the RSS after
 * the first ones, at most SLOPE_TARGET_MB (what hurts an agent that runs for months).
 */
const IDLE_TARGET_MB = 80;
const LOADED_MARGIN_MB = 15;
const LEAK_MARGIN_MB = 15;
const SLOPE_TARGET_MB = 3;
/** Cycles run at once in the leak row. */
const CYCLE_CONCURRENCY = 20;

/**
 * The shim's resident set (VmRSS, MB): the median of samples taken 500 ms apart after a settle
 * of 15 s, time for one round of the shim's idle heap trim (every 10 s, src/cli/heap-trim.ts) to
 * return what the burst before it left in the heap, as it would on a host between bursts.
 */
export async function sampleRss(shim: ShimProcess, settleMs = 15_000, samples = 5): Promise<number> {
  const pid = shim.child.pid;
  if (pid === undefined) throw new Error("shim has no pid");
  await sleep(settleMs);
  const values: number[] = [];
  for (let i = 0; i < samples; i++) {
    values.push(await statusMB(pid, "VmRSS"));
    await sleep(500);
  }
  return median(values);
}

/** V8's view of the shim's memory (from its /metrics) and where its resident set lies, for the notes. */
async function heapBreakdown(shim: ShimProcess): Promise<string> {
  const samples = parsePrometheus((await shim.request("GET", "/metrics")).text);
  const pid = shim.child.pid;
  const r = pid === undefined ? undefined : await residentBreakdown(pid);
  const resident =
    r === undefined
      ? ""
      : `; resident: file pages ${r.file}, main arena ${r.brk}, ${r.arenaCount} thread arenas ${r.arenas}, ` +
        `JIT code ${r.code}, other anonymous ${r.otherAnon} MB`;
  const mb = (name: string): number => round(sumOf(samples, name) / 1e6);
  const space = (name: string): number =>
    round(sumOf(samples, "taskshim_nodejs_heap_space_size_total_bytes", { space: name }) / 1e6);
  return (
    `V8 heap used ${mb("taskshim_nodejs_heap_size_used_bytes")} MB of ` +
    `${mb("taskshim_nodejs_heap_size_total_bytes")} MB (new space ${space("new")} MB, old space ` +
    `${space("old")} MB), external ${mb("taskshim_nodejs_external_memory_bytes")} MB${resident}`
  );
}

/** B6 row of the idle shim (no task). */
export async function runB6Idle(bench: Bench, shim: ShimProcess): Promise<Row> {
  const rss = round(await sampleRss(shim));
  const adopted = (await shim.request<{ tasks: unknown[] }>("GET", "/api/tasks")).json.tasks.length;
  bench.note(
    `B6 idle RSS ${rss} MB (no task of this run; ${adopted} adopted from the shared engine); ` +
      (await heapBreakdown(shim)),
  );
  return rssRow("memory: shim RSS, idle (no task)", rss, IDLE_TARGET_MB);
}

/** B6 row of the shim with the fleet running. */
export async function runB6Loaded(
  bench: Bench,
  shim: ShimProcess,
  tasks: number,
  idleRss: number,
): Promise<Row> {
  const rss = round(await sampleRss(shim));
  bench.note(`B6 RSS with ${tasks} running tasks ${rss} MB; ${await heapBreakdown(shim)}`);
  return rssRow(
    `memory: shim RSS with ${tasks} running tasks, target idle + ${LOADED_MARGIN_MB} MB`,
    rss,
    round(idleRss + LOADED_MARGIN_MB),
  );
}

/**
 * B6's cycle rows, on a shim of their own (stopped at the end, so that the fleet's rows measure
 * what running tasks cost, not what the cycles left behind): `first` tasks that exit at once
 * (`true`), each submitted, waited for until terminated and removed, CYCLE_CONCURRENCY at a time,
 * against this shim's idle RSS plus LEAK_MARGIN_MB; then the slope row over `more` cycles.
 */
export async function runB6Cycles(bench: Bench, first: number, more: number): Promise<Row[]> {
  const shim = await bench.startShim();
  try {
    const idleRss = round(await sampleRss(shim));
    const seconds = await runCycles(bench, shim, 0, first);
    const rss = round(await sampleRss(shim));
    bench.note(
      `B6 after ${first} submit → exit → remove cycles (${CYCLE_CONCURRENCY} at a time, ${seconds} s), on a shim of ` +
        `their own: RSS ${rss} MB against ${idleRss} MB idle; ${await heapBreakdown(shim)}`,
    );
    const leak = rssRow(
      `memory: shim RSS after ${first} submit → exit → remove cycles (${CYCLE_CONCURRENCY} at a time), target idle + ${LEAK_MARGIN_MB} MB`,
      rss,
      round(idleRss + LEAK_MARGIN_MB),
    );
    return [leak, await runB6Slope(bench, shim, first, rss, more)];
  } finally {
    await shim.stop();
  }
}

/** `count` submit → exit → remove cycles, CYCLE_CONCURRENCY at a time; the seconds they took. */
async function runCycles(bench: Bench, shim: ShimProcess, first: number, count: number): Promise<number> {
  const started = performance.now();
  let next = first;
  const worker = async (): Promise<void> => {
    while (next < first + count) {
      const id = bench.name("b6cycle", next++);
      await shim.submit(bench.taskConfig(id, ["true"]));
      await shim.waitTask(id, (t) => t.status === "terminated", 60_000, 100);
      const removed = await shim.remove(id);
      if (removed.status !== 200) throw new Error(`B6 remove ${id}: ${removed.status} ${removed.text}`);
    }
  };
  await Promise.all(Array.from({ length: CYCLE_CONCURRENCY }, worker));
  return round((performance.now() - started) / 1000, 0);
}

/**
 * B6-slope: after the leak row's `done` cycles (RSS `afterDone`), `more` cycles again; the RSS
 * they add, against SLOPE_TARGET_MB. Full runs only: 9,000 cycles take minutes.
 */
async function runB6Slope(
  bench: Bench,
  shim: ShimProcess,
  done: number,
  afterDone: number,
  more: number,
): Promise<Row> {
  const seconds = await runCycles(bench, shim, done, more);
  const rss = round(await sampleRss(shim));
  const slope = round(rss - afterDone);
  bench.note(
    `B6-slope: RSS ${afterDone} MB after ${done} cycles, ${rss} MB after ${done + more} (${seconds} s for the last ${more}): ` +
      `${slope} MB; ${await heapBreakdown(shim)}`,
  );
  return {
    id: "B6-slope",
    name: `memory: RSS after ${done + more} cycles minus RSS after ${done}`,
    unit: "MB",
    taskshim: slope,
    baseline: null,
    ratio: null,
    target: `<= ${SLOPE_TARGET_MB} MB`,
    pass: slope <= SLOPE_TARGET_MB,
  };
}

function rssRow(name: string, rss: number, targetMb: number): Row {
  return {
    id: "B6",
    name,
    unit: "MB",
    taskshim: rss,
    baseline: null,
    ratio: null,
    target: `<= ${targetMb} MB`,
    pass: rss <= targetMb,
  };
}

/** The shim's peak resident set so far (VmHWM) and its heap now, for the notes. */
export async function notePeakRss(bench: Bench, shim: ShimProcess): Promise<void> {
  const pid = shim.child.pid;
  if (pid === undefined) return;
  const peak = round(await statusMB(pid, "VmHWM"));
  const now = round(await statusMB(pid, "VmRSS"));
  bench.note(`B6 after B4/B5: peak RSS (VmHWM) ${peak} MB, RSS now ${now} MB; ${await heapBreakdown(shim)}`);
}
