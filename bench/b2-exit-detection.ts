import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import { TESTING_ENV } from "../src/config/shim-config.js";
import type { ShimProcess } from "../test/support/shim-process.js";
import { dockerTimeMs, startTasks, taskStatuses, wallMs, type Bench } from "./lib/harness.js";
import type { Row } from "./lib/report.js";
import { describe, median, percentile, round } from "./lib/stats.js";

/**
 * How often the client polls `GET /api/tasks`. A terminated status is dated midway between the
 * previous answer and the first one that shows it (no bias, ±POLL_MS/2 of noise); polling much
 * faster would take CPU from the engine and the shim on 2 cores.
 */
const POLL_MS = 10;

/** Where the time between an exit and the API's `terminated` went, per task (ms). */
interface Exit {
  /** `State.FinishedAt` → the API first answered `terminated`: the figure of B2. */
  readonly total: number;
  /** `State.FinishedAt` → a plain client received Docker's `die` event: the engine's own share. */
  readonly engine: number;
  /** The `die` event → the API first answered `terminated`: the shim's share. */
  readonly shim: number;
}

/**
 * Follows the engine's `die` events of task containers, as a plain client would, and records
 * when each arrived (wall clock), by container id.
 */
async function followDies(bench: Bench, arrivals: Map<string, number>): Promise<() => void> {
  const stream = (await bench.docker.getEvents({
    filters: { type: ["container"], event: ["die"], label: ["ai.dstack.shim.is-task=true"] },
  })) as Readable;
  const lines = createInterface({ input: stream, crlfDelay: Infinity });
  lines.on("line", (line) => {
    const at = wallMs();
    try {
      const event = JSON.parse(line) as { id?: string };
      if (event.id && !arrivals.has(event.id)) arrivals.set(event.id, at);
    } catch {
      // not an event
    }
  });
  return () => {
    lines.close();
    stream.destroy();
  };
}

/** One mode: a fresh shim, `count` exits measured. */
async function measureMode(bench: Bench, mode: "events" | "list", count: number): Promise<Exit[]> {
  const shim = await bench.startShim(mode === "list" ? { env: { [TESTING_ENV.noEvents]: "1" } } : {});
  try {
    return await measureExits(bench, shim, mode, count);
  } finally {
    await bench.stopShim(shim);
  }
}

/**
 * The workload: waits, without polling, until it gets SIGUSR1, then exits 0 on its own. The
 * signal comes through the Engine API (`POST /containers/{id}/kill?signal=SIGUSR1`), so exits
 * can be spaced out without any container start happening at the same time.
 */
const WAIT_FOR_SIGNAL = ["sh", "-c", 'trap "exit 0" USR1; sleep 86400 & wait'];

/**
 * Starts `count` tasks (in batches, waited for until running), lets the engine settle, then
 * makes them exit one at a time, a random 0.5–1.5 × `spacing` apart, so exits fall at random
 * phases of the reconcile loop. A poller records when `GET /api/tasks` first shows each
 * one terminated; the exit itself is Docker's `State.FinishedAt` (containerd's exit time).
 */
async function measureExits(bench: Bench, shim: ShimProcess, mode: string, count: number): Promise<Exit[]> {
  const spacingMs = bench.quick ? 200 : 250;
  const ids = Array.from({ length: count }, (_, i) => bench.name(`b2${mode}`, i));
  await startTasks(bench, shim, ids, WAIT_FOR_SIGNAL, 20);
  const containers = await Promise.all(ids.map(async (id) => (await shim.task(id)).container_id));
  await sleep(2_000);
  const seen = new Map<string, number>();
  const dies = new Map<string, number>();
  const stopFollowing = await followDies(bench, dies);
  let polling = true;
  let pollError: Error | undefined;
  const poller = (async () => {
    let previous = wallMs();
    while (polling) {
      try {
        const statuses = await taskStatuses(shim);
        const answered = wallMs();
        const at = (previous + answered) / 2;
        previous = answered;
        for (const [id, status] of statuses) if (status === "terminated" && !seen.has(id)) seen.set(id, at);
      } catch (error) {
        pollError = error instanceof Error ? error : new Error(String(error));
        return;
      }
      await sleep(POLL_MS);
    }
  })();
  try {
    for (const container of containers) {
      await bench.docker.getContainer(container).kill({ signal: "SIGUSR1" });
      await sleep(spacingMs * (0.5 + Math.random()));
    }
    const deadline = performance.now() + 60_000;
    while (ids.some((id) => !seen.has(id))) {
      if (pollError) throw pollError;
      if (performance.now() > deadline) throw new Error(`B2 (${mode}): not every task terminated in time`);
      await sleep(50);
    }
  } finally {
    polling = false;
    await poller;
    stopFollowing();
  }
  const exits = await pLimit(8).map(ids, async (id): Promise<Exit> => {
    const task = await shim.task(id);
    if (task.termination_reason !== "done_by_runner")
      throw new Error(`B2 task ${id}: ${task.termination_reason} ${task.termination_message}`);
    const info = await bench.docker.getContainer(task.container_id).inspect();
    const finished = dockerTimeMs(info.State.FinishedAt);
    const die = dies.get(info.Id) ?? Number.NaN;
    const at = seen.get(id)!;
    return { total: at - finished, engine: die - finished, shim: at - die };
  });
  await bench.removeTasks(shim, ids);
  return exits;
}

function explain(bench: Bench, label: string, exits: readonly Exit[]): void {
  const pick = (key: keyof Exit): number[] => exits.map((e) => e[key]).filter((v) => Number.isFinite(v));
  bench.note(`B2 ${label}: exit → API terminated ${describe(pick("total"), " ms", 0)}`);
  bench.note(
    `B2 ${label}:   of which exit → Docker die event at a plain client ${describe(pick("engine"), " ms", 0)}`,
  );
  bench.note(`B2 ${label}:   of which die event → API terminated ${describe(pick("shim"), " ms", 0)}`);
}

/**
 * B2: container exit → the API reports `terminated`. p50 with the event stream on (the normal
 * path: a `die` event kicks a tick), p99 with it off (`TASKSHIM_NO_EVENTS=1`: only the periodic
 * list sees exits, so this is the safety net's worst case). The engine's own share (exit →
 * its `die` event reaching a plain client) is measured alongside and given in the notes; the
 * shim's share (that event → the API's `terminated`) is row B2e.
 */
export async function runB2(bench: Bench): Promise<Row[]> {
  const count = bench.quick ? 20 : 100;
  const events = await measureMode(bench, "events", count);
  explain(bench, "event stream on ", events);
  const list = await measureMode(bench, "list", count);
  explain(bench, "event stream off", list);
  const p50 = round(median(events.map((e) => e.total)));
  const shimShare = round(median(events.map((e) => e.shim).filter((v) => Number.isFinite(v))));
  const p99 = round(
    percentile(
      list.map((e) => e.total),
      99,
    ),
  );
  return [
    {
      id: "B2",
      name: `container exit → API reports terminated, p50 of ${count} exits (event stream on)`,
      unit: "ms",
      taskshim: p50,
      baseline: null,
      ratio: null,
      target: "<= 100 ms",
      pass: p50 <= 100,
    },
    {
      id: "B2e",
      name: `the shim's own share: Docker die event at a plain client → API reports terminated, p50 of ${count} exits`,
      unit: "ms",
      taskshim: shimShare,
      baseline: null,
      ratio: null,
      target: "<= 5 ms",
      pass: shimShare <= 5,
    },
    {
      id: "B2",
      name: `container exit → API reports terminated, p99 of ${count} exits (event stream off: periodic list only)`,
      unit: "ms",
      taskshim: p99,
      baseline: null,
      ratio: null,
      target: "<= 1100 ms",
      pass: p99 <= 1100,
    },
  ];
}
