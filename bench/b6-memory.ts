import { setTimeout as sleep } from "node:timers/promises";
import type { ShimProcess } from "../test/support/shim-process.js";
import type { Bench } from "./lib/harness.js";
import { residentBreakdown, statusMB, type ResidentBreakdown } from "./lib/proc.js";
import { parsePrometheus, sumOf } from "./lib/prometheus.js";
import type { Row } from "./lib/report.js";
import { leastSquaresSlope, median, round } from "./lib/stats.js";

/**
 * Memory targets (BENCHMARKS.md): idle; with the fleet, at most idle + LOADED_MARGIN_MB; growth
 * after submit → exit → remove cycles; and the slope: what the later cycles add to the RSS after
 * the first ones, at most SLOPE_TARGET_MB (what hurts an agent that runs for months).
 */
const IDLE_TARGET_MB = 80;
export const LOADED_MARGIN_MB = 15;
const LEAK_MARGIN_MB = 15;
const SLOPE_TARGET_MB = 3;
/** Cycles run at once in the leak row. */
const CYCLE_CONCURRENCY = 20;

/** The settle before the first sample: one round of the shim's idle heap trim (every 10 s). */
const SETTLE_MS = 15_000;
/** Samples one second apart; settled once the last SETTLED_SAMPLES span at most SETTLED_SPAN_MB. */
const SETTLED_SAMPLES = 12;
const SETTLED_SPAN_MB = 0.3;
/** The longest the samples go on for if the resident set does not settle. */
const SAMPLE_LIMIT_MS = 90_000;

/** The shim's memory once settled (MB), and where its resident set lies, read right after. */
export interface SettledMemory {
  /** VmRSS: the median of the last SETTLED_SAMPLES samples. */
  readonly rss: number;
  /** Whether those samples lie within SETTLED_SPAN_MB (false: SAMPLE_LIMIT_MS came first). */
  readonly settled: boolean;
  /** Their span (max − min). */
  readonly span: number;
  /** Seconds from the first sample to the last (SETTLED_SAMPLES − 1 when it settled at once). */
  readonly sampledS: number;
  readonly breakdown: ResidentBreakdown;
}

/**
 * The shim's resident set once it has settled, as on a host between bursts: after SETTLE_MS,
 * VmRSS every second until SETTLED_SAMPLES in a row (more than one heap-trim round) lie within
 * SETTLED_SPAN_MB, or SAMPLE_LIMIT_MS. A fixed window was not enough: after 10,000 cycles its
 * median caught ~3 MB that the breakdown read seconds later no longer found (V8 and glibc
 * returning pages after the trim's collection), the order of the slope's target. The breakdown
 * is read right after the last sample, so the two describe the same pages.
 */
export async function settledMemory(shim: ShimProcess): Promise<SettledMemory> {
  const pid = shim.child.pid;
  if (pid === undefined) throw new Error("shim has no pid");
  await sleep(SETTLE_MS);
  const started = performance.now();
  const values: number[] = [];
  let last: number[];
  let settled: boolean;
  for (;;) {
    values.push(await statusMB(pid, "VmRSS"));
    last = values.slice(-SETTLED_SAMPLES);
    settled = last.length === SETTLED_SAMPLES && Math.max(...last) - Math.min(...last) <= SETTLED_SPAN_MB;
    if (settled || performance.now() - started >= SAMPLE_LIMIT_MS) break;
    await sleep(1_000);
  }
  return {
    rss: round(median(last)),
    settled,
    span: round(Math.max(...last) - Math.min(...last)),
    sampledS: round((performance.now() - started) / 1000, 0),
    breakdown: await residentBreakdown(pid),
  };
}

/**
 * V8's view of the shim's memory (from its /metrics) and where its resident set lies (`memory`'s
 * breakdown, or one read now), for the notes.
 */
async function heapBreakdown(shim: ShimProcess, memory?: SettledMemory): Promise<string> {
  const samples = parsePrometheus((await shim.request("GET", "/metrics")).text);
  const pid = shim.child.pid;
  const r = memory?.breakdown ?? (pid === undefined ? undefined : await residentBreakdown(pid));
  const settled =
    memory === undefined
      ? ""
      : `${memory.settled ? "settled after" : "not settled in"} ${memory.sampledS} s of samples ` +
        `(the last ${SETTLED_SAMPLES} within ${memory.span} MB); `;
  const resident =
    r === undefined
      ? ""
      : `; resident right after (smaps, ${r.total} MB): file pages ${r.file}, main arena ${r.brk}, ` +
        `${r.arenaCount} thread arenas ${r.arenas}, JIT code ${r.code}, other anonymous ${r.otherAnon} MB`;
  const mb = (name: string): number => round(sumOf(samples, name) / 1e6);
  const space = (name: string): number =>
    round(sumOf(samples, "taskshim_nodejs_heap_space_size_total_bytes", { space: name }) / 1e6);
  return (
    `${settled}V8 heap used ${mb("taskshim_nodejs_heap_size_used_bytes")} MB of ` +
    `${mb("taskshim_nodejs_heap_size_total_bytes")} MB (new space ${space("new")} MB, old space ` +
    `${space("old")} MB), external ${mb("taskshim_nodejs_external_memory_bytes")} MB${resident}`
  );
}

/** B6 row of the idle shim (no task). */
export async function runB6Idle(bench: Bench, shim: ShimProcess): Promise<Row> {
  const memory = await settledMemory(shim);
  const adopted = (await shim.request<{ tasks: unknown[] }>("GET", "/api/tasks")).json.tasks.length;
  bench.note(
    `B6 idle RSS ${memory.rss} MB (no task of this run; ${adopted} adopted from the shared engine); ` +
      (await heapBreakdown(shim, memory)),
  );
  return rssRow("memory: shim RSS, idle (no task)", memory.rss, IDLE_TARGET_MB);
}

/** B6 row of the shim with the fleet running. */
export async function runB6Loaded(
  bench: Bench,
  shim: ShimProcess,
  tasks: number,
  idleRss: number,
): Promise<Row> {
  const memory = await settledMemory(shim);
  bench.note(`B6 RSS with ${tasks} running tasks ${memory.rss} MB; ${await heapBreakdown(shim, memory)}`);
  return rssRow(
    `memory: shim RSS with ${tasks} running tasks, target idle + ${LOADED_MARGIN_MB} MB`,
    memory.rss,
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
    const idle = await settledMemory(shim);
    const seconds = await runCycles(bench, shim, 0, first);
    const memory = await settledMemory(shim);
    bench.note(
      `B6 after ${first} submit → exit → remove cycles (${CYCLE_CONCURRENCY} at a time, ${seconds} s), on a shim of ` +
        `their own: RSS ${memory.rss} MB against ${idle.rss} MB idle; ${await heapBreakdown(shim, memory)}`,
    );
    const leak = rssRow(
      `memory: shim RSS after ${first} submit → exit → remove cycles (${CYCLE_CONCURRENCY} at a time), target idle + ${LEAK_MARGIN_MB} MB`,
      memory.rss,
      round(idle.rss + LEAK_MARGIN_MB),
    );
    return [leak, ...(await runB6Slope(bench, shim, first, memory.rss, more))];
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
 * B6-slope: after the leak row's `done` cycles (RSS `afterDone`), `more` cycles again, with a
 * settled RSS after every `done` of them (checkpoints). Settled RSS moves by up to ~3.6 MB between
 * checkpoints with no trend (88.3, 87.1, 84.9, 88.5 MB every 133 cycles in a quick run of
 * 3 December): as much as the target, so the difference of the two ends is noise. The row is the
 * least-squares line through every checkpoint, evaluated over the `more` cycles; the ends'
 * difference is a second row, reported. Full runs only: 9,000 cycles take most of an hour.
 */
async function runB6Slope(
  bench: Bench,
  shim: ShimProcess,
  done: number,
  afterDone: number,
  more: number,
): Promise<Row[]> {
  const checkpoints: [number, number][] = [[done, afterDone]];
  let memory: SettledMemory | undefined;
  let seconds = 0;
  for (let from = done; from < done + more; from += done) {
    const count = Math.min(done, done + more - from);
    seconds += await runCycles(bench, shim, from, count);
    memory = await settledMemory(shim);
    checkpoints.push([from + count, memory.rss]);
  }
  if (memory === undefined) throw new Error("B6-slope ran no cycles");
  const ends = round(memory.rss - afterDone);
  const fitted = round(leastSquaresSlope(checkpoints) * more);
  bench.note(
    `B6-slope: RSS ${afterDone} MB after ${done} cycles, ${memory.rss} MB after ${done + more} (${seconds} s for the last ${more}, ` +
      `settled RSS read every ${done}): ${checkpoints.map(([n, rss]) => `${n}: ${rss}`).join(", ")} MB; ` +
      `least-squares growth ${fitted} MB, the ends' difference ${ends} MB; ${await heapBreakdown(shim, memory)}`,
  );
  const row = { id: "B6-slope", unit: "MB", baseline: null, ratio: null } as const;
  return [
    {
      ...row,
      name: `memory: RSS growth from cycle ${done} to ${done + more}, least-squares line through a settled RSS every ${done} cycles`,
      taskshim: fitted,
      target: `<= ${SLOPE_TARGET_MB} MB`,
      pass: fitted <= SLOPE_TARGET_MB,
    },
    {
      ...row,
      name: `memory: RSS after ${done + more} cycles minus RSS after ${done} (the two ends alone)`,
      taskshim: ends,
      target: "reported",
      pass: true,
    },
  ];
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
