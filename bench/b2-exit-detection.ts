import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import { TESTING_ENV } from "../src/config/shim-config.js";
import type { ShimProcess } from "../test/support/shim-process.js";
import type { EngineKind } from "./lib/engines.js";
import { dockerTimeMs, startTasks, taskStatuses, wallMs, type Bench } from "./lib/harness.js";
import { ratioRow, type Row } from "./lib/report.js";
import { describe, median, percentile, round } from "./lib/stats.js";

/**
 * How often the client polls `GET /api/tasks` with the event stream off. The shim reads its state
 * somewhere between a request and its answer, so each poll is dated at their midpoint, and a
 * terminated status midway between the poll before and the first one that shows it (±POLL_MS/2
 * of noise). Dating by the answers alone would add half a round trip to every figure; polling much
 * faster would take CPU from the engine and the shim on 2 cores.
 */
const POLL_MS = 10;

/**
 * With the event stream on, the client instead chases each exit: from the moment its `die` event
 * reaches the client, it asks `GET /api/tasks/{id}` every CHASE_MS until `terminated`. A 10 ms
 * poll's noise (±5 ms) would be larger than the figure measured (B2e, a few ms); a chase lasts
 * only that long, so it costs the shim little.
 */
const CHASE_MS = 1;

/**
 * Where a chase starts. Docker sends a `die` event to every subscriber at the same moment, so the
 * bench's own subscription is when the shim's could have heard of the exit, and chasing from it
 * keeps the chase short. Podman's service reads its events file every 250 ms for each
 * subscriber on that subscriber's own phase (two streams opened 120 ms apart got each `die`
 * either ~105 ms before or ~150 ms after one another): the shim's stream may hear of an exit
 * up to 250 ms before or after the bench's. Chasing from the bench's `die` would date every exit
 * the shim saw first as the bench's event, and add the phase gap to every one it saw later. So
 * on Podman the chase starts when the bench sends the signal, every KILL_CHASE_MS (~300 ms of
 * reads per exit: a few hundred cheap requests, under 2 % of a core), and the exit → terminated
 * figure is not tied to the bench's own subscription.
 */
const CHASE_FROM: Readonly<Record<EngineKind, "die" | "signal">> = { docker: "die", podman: "signal" };
const KILL_CHASE_MS = 2;

/** Where the time between an exit and the API's `terminated` went, per task (ms). */
interface Exit {
  /** `State.FinishedAt` → the API first answered `terminated`: the figure of B2. */
  readonly total: number;
  /** `State.FinishedAt` → a plain client received the engine's `die` event: the engine's own share. */
  readonly engine: number;
  /** The `die` event → the API first answered `terminated`: the shim's share. */
  readonly shim: number;
}

/**
 * Follows the engine's `die` events of task containers, as a plain client would, and calls
 * `onDie` with the container id and when the event arrived (wall clock), once per container.
 * The `die` is picked out here, not by an `event` filter: Podman 4.3's compatible API answers a
 * stream filtered by `event=die` with no event at all (its own name is `died`), while its type
 * and label filters work as Docker's. Docker's stream then carries the task containers' other
 * events too (create, start, kill, destroy), a few lines per task.
 */
async function followDies(bench: Bench, onDie: (id: string, at: number) => void): Promise<() => void> {
  const stream = (await bench.docker.getEvents({
    filters: { type: ["container"], label: ["ai.dstack.shim.is-task=true"] },
  })) as Readable;
  const lines = createInterface({ input: stream, crlfDelay: Infinity });
  const seen = new Set<string>();
  lines.on("line", (line) => {
    const at = wallMs();
    try {
      const event = JSON.parse(line) as { id?: string; status?: string; Action?: string };
      if ((event.Action ?? event.status) !== "die") return;
      if (event.id && !seen.has(event.id)) {
        seen.add(event.id);
        onDie(event.id, at);
      }
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
 * From `since` (wall clock), asks for one task every CHASE_MS until it is terminated; resolves
 * when that happened, midway between the last read short of it and the first that shows it.
 */
async function chase(shim: ShimProcess, id: string, since: number, everyMs = CHASE_MS): Promise<number> {
  const deadline = performance.now() + 10_000;
  let previous = since;
  for (;;) {
    const asked = wallMs();
    const task = await shim.task(id);
    const read = (asked + wallMs()) / 2;
    if (task.status === "terminated") return (previous + read) / 2;
    previous = read;
    if (performance.now() > deadline)
      throw new Error(`B2: task ${id} not terminated 10 s after its die event`);
    await sleep(everyMs);
  }
}

/** With the event stream off: polls the whole list every POLL_MS until `stop`, dating each `terminated`. */
function pollAll(
  shim: ShimProcess,
  seen: Map<string, number>,
): { stop: () => Promise<void>; error: () => Error | undefined } {
  let polling = true;
  let failure: Error | undefined;
  const poller = (async () => {
    let previous = wallMs();
    while (polling) {
      try {
        const asked = wallMs();
        const statuses = await taskStatuses(shim);
        const read = (asked + wallMs()) / 2;
        for (const [id, status] of statuses)
          if (status === "terminated" && !seen.has(id)) seen.set(id, (previous + read) / 2);
        previous = read;
      } catch (error) {
        failure = error instanceof Error ? error : new Error(String(error));
        return;
      }
      await sleep(POLL_MS);
    }
  })();
  return {
    stop: async () => {
      polling = false;
      await poller;
    },
    error: () => failure,
  };
}

/**
 * Starts `count` tasks (in batches, waited for until running), lets the engine settle, then
 * makes them exit one at a time, a random 0.5–1.5 × `spacing` apart, so exits fall at random
 * phases of the reconcile loop. Records when the API first shows each one terminated (a chase
 * from its die event, or the list poll with the event stream off); the exit itself is the
 * engine's `State.FinishedAt` (Docker: containerd's exit time; Podman: conmon's exit file).
 */
async function measureExits(
  bench: Bench,
  shim: ShimProcess,
  mode: "events" | "list",
  count: number,
): Promise<Exit[]> {
  const spacingMs = bench.quick ? 200 : 250;
  const ids = Array.from({ length: count }, (_, i) => bench.name(`b2${mode}`, i));
  await startTasks(bench, shim, ids, WAIT_FOR_SIGNAL, 20);
  const containers = await Promise.all(ids.map(async (id) => (await shim.task(id)).container_id));
  const taskOf = new Map(containers.map((container, i) => [container, ids[i]!]));
  await sleep(2_000);
  const seen = new Map<string, number>();
  const dies = new Map<string, number>();
  const chases: Promise<void>[] = [];
  let chaseFailure: Error | undefined;
  const startChase = (id: string, since: number, everyMs?: number): void =>
    void chases.push(
      chase(shim, id, since, everyMs).then(
        (when) => void seen.set(id, when),
        (error: unknown) => void (chaseFailure ??= error instanceof Error ? error : new Error(String(error))),
      ),
    );
  const chaseFrom = mode === "events" ? CHASE_FROM[bench.engine.kind] : undefined;
  const stopFollowing = await followDies(bench, (container, at) => {
    dies.set(container, at);
    const id = taskOf.get(container);
    if (chaseFrom === "die" && id !== undefined) startChase(id, at);
  });
  const poll = mode === "list" ? pollAll(shim, seen) : undefined;
  try {
    for (const [i, container] of containers.entries()) {
      if (chaseFrom === "signal") startChase(ids[i]!, wallMs(), KILL_CHASE_MS);
      await bench.docker.getContainer(container).kill({ signal: "SIGUSR1" });
      await sleep(spacingMs * (0.5 + Math.random()));
    }
    const deadline = performance.now() + 60_000;
    while (ids.some((id) => !seen.has(id))) {
      const failure = poll?.error() ?? chaseFailure;
      if (failure) throw failure;
      if (performance.now() > deadline) throw new Error(`B2 (${mode}): not every task terminated in time`);
      await sleep(50);
    }
    await Promise.all(chases);
  } finally {
    await poll?.stop();
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
    `B2 ${label}:   of which exit → ${bench.engine.label} die event at a plain client ${describe(pick("engine"), " ms", 0)}`,
  );
  // On Podman the shim's stream and the bench's read the events file on phases of their own.
  const across = bench.engine.kind === "podman" ? " (across two subscriptions' 250 ms read phases)" : "";
  bench.note(
    `B2 ${label}:   of which die event → API terminated${across} ${describe(pick("shim"), " ms", 0)}`,
  );
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
  const finite = (values: number[]): number[] => values.filter((v) => Number.isFinite(v));
  const p50 = round(median(events.map((e) => e.total)));
  const engineP50 = round(median(finite(events.map((e) => e.engine))));
  const shimShare = round(median(finite(events.map((e) => e.shim))));
  const p99 = round(
    percentile(
      list.map((e) => e.total),
      99,
    ),
  );
  const engine = bench.engine.label;
  const ratio = engineP50 > 0 ? p50 / engineP50 : Number.POSITIVE_INFINITY;
  return [
    ratioRow({
      id: "B2",
      name: `container exit → API reports terminated, p50 of ${count} exits (event stream on)`,
      unit: "ms",
      taskshim: p50,
      // The raw engine's own exit detection: the same exits' `die` event at a plain client.
      baseline: engineP50,
      ...(bench.engine.kind === "podman"
        ? { target: `ratio <= ${PODMAN_B2_RATIO.toFixed(2)}`, pass: ratio <= PODMAN_B2_RATIO }
        : { target: "<= 100 ms", pass: p50 <= 100 }),
    }),
    bench.engine.kind === "podman"
      ? {
          // Per exit, the split would measure the gap between two subscribers' read phases (see
          // CHASE_FROM): on Podman the shim's share is the difference of the two p50s, reported.
          id: "B2e",
          name: `the shim's own share: p50 above minus the p50 of ${engine}'s die event at a plain client`,
          unit: "ms",
          taskshim: round(p50 - engineP50),
          baseline: null,
          ratio: null,
          target: "— (reported; the ratio above is the target)",
          pass: true,
        }
      : {
          id: "B2e",
          name: `the shim's own share: ${engine} die event at a plain client → API reports terminated, p50 of ${count} exits`,
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

/**
 * B2's p50 target on Podman, as a ratio to the engine's own `die` event at a plain client: that
 * event reaches a subscriber 100–640 ms after `FinishedAt` (Podman's cleanup process records the
 * exit, then its service reads the events file every 250 ms), so Docker's absolute 100 ms cannot
 * be met by any client of the API. What the shim can answer for is what it adds to that. The
 * shim's stream and the bench's plain client each read on their own 250 ms phase, so over many
 * exits their medians match and the ratio is 1 plus the shim's own work; 1.10 leaves room for
 * the median's noise (the phase spreads single exits over 250 ms).
 */
const PODMAN_B2_RATIO = 1.1;
