import { setTimeout as sleep } from "node:timers/promises";
import {
  ShimHttpError,
  ShimUnreachableError,
  type ShimClient,
  type ShimTaskEvent,
  type ShimTaskInfo,
} from "../control/shim-client.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { escapeControls } from "./terminal-text.js";

/** Waiting for a task gave up before it reached the awaited status; the task itself goes on. */
export class FollowTimeoutError extends Error {
  override readonly name = "FollowTimeoutError";
}

/** Clocks and sleep, injectable so the loops can be tested without waiting. */
export interface LoopClock {
  /** Monotonic ms: every timeout and grace is counted on it, so a stepped wall clock moves none. */
  readonly now: () => number;
  /** Wall-clock ms: only the `time` of the events printed. */
  readonly wallNow: () => number;
  readonly sleep: (ms: number) => Promise<void>;
}

const REAL_CLOCK: LoopClock = {
  now: () => performance.now(),
  wallNow: () => Date.now(),
  sleep: (ms) => sleep(ms),
};

/**
 * How long the shim may stay unreachable while a loop follows it: long enough to ride out a
 * restart or an upgrade handoff (the task survives those), short enough not to hang forever.
 */
export const UNREACHABLE_GRACE_MS = 30_000;

/** Options of {@link followStart}. */
export interface FollowStartOptions {
  /** Give up after this long (0 = never). */
  readonly timeoutMs: number;
  readonly pollMs: number;
  readonly clock?: LoopClock;
}

/**
 * Polls a submitted task until it is `running` or `terminated`, handing every poll to
 * `onPoll` (the progress display). A shim that stops answering for a moment (a restart) is
 * waited for; a shim that answers with an error ends the follow with that error.
 */
export function followStart(
  client: Pick<ShimClient, "getTask">,
  id: string,
  onPoll: (task: ShimTaskInfo) => void,
  options: FollowStartOptions,
): Promise<ShimTaskInfo> {
  return pollTask(client, id, options, {
    done: (task) => task.status === "running" || task.status === "terminated",
    onPoll,
    stillGoing: `; it keeps going (see taskshim tasks get ${id})`,
  });
}

/**
 * Polls a task until `done` says so. A shim that stops answering for a moment (a restart) is
 * waited for, up to the unreachable grace; an error answer ends the poll with that error; past
 * the options' timeout a `FollowTimeoutError` names the last status seen (and `stillGoing`).
 */
async function pollTask(
  client: Pick<ShimClient, "getTask">,
  id: string,
  options: FollowStartOptions,
  how: {
    readonly done: (task: ShimTaskInfo) => boolean;
    readonly onPoll?: (task: ShimTaskInfo) => void;
    readonly stillGoing?: string;
  },
): Promise<ShimTaskInfo> {
  const clock = options.clock ?? REAL_CLOCK;
  const deadline = options.timeoutMs > 0 ? clock.now() + options.timeoutMs : Number.POSITIVE_INFINITY;
  let unreachableSince: number | undefined;
  let last: ShimTaskInfo | undefined;
  for (;;) {
    try {
      last = await client.getTask(id);
      unreachableSince = undefined;
    } catch (error) {
      if (!(error instanceof ShimUnreachableError)) throw error;
      unreachableSince ??= clock.now();
      if (clock.now() - unreachableSince > UNREACHABLE_GRACE_MS) throw error;
    }
    if (last) {
      how.onPoll?.(last);
      if (how.done(last)) return last;
    }
    if (clock.now() >= deadline) {
      throw new FollowTimeoutError(
        `task ${id} is still ${last?.status ?? "unknown"} after ${Math.round(options.timeoutMs / 1000)} s` +
          (how.stillGoing ?? ""),
      );
    }
    await clock.sleep(Math.min(options.pollMs, Math.max(0, deadline - clock.now())));
  }
}

/**
 * What `tasks watch` reports about one task: a line of taskshim's event stream, or the same
 * shape made from two polls of a shim without it (`termination_reason` and `exit_code` only
 * when the task became terminated and the shim still had it).
 */
export type WatchEvent = ShimTaskEvent;

/** A status change between two polls (no time yet, no reason yet). */
export type StatusChange = Omit<WatchEvent, "time" | "termination_reason">;

/** The changes from one task list to the next, in the order of the new list, removals last. */
export function diffTaskStatuses(
  previous: ReadonlyMap<string, TaskStatus>,
  current: readonly { readonly id: string; readonly status: TaskStatus }[],
): StatusChange[] {
  const changes: StatusChange[] = [];
  const seen = new Set<string>();
  for (const { id, status } of current) {
    seen.add(id);
    const before = previous.get(id);
    if (before === undefined) changes.push({ kind: "added", id, from: null, to: status });
    else if (before !== status) changes.push({ kind: "changed", id, from: before, to: status });
  }
  for (const [id, status] of previous) {
    if (!seen.has(id)) changes.push({ kind: "removed", id, from: status, to: null });
  }
  return changes;
}

/** One watch event as an aligned line: `TIME  ID  FROM -> TO  (REASON)`. */
export function formatWatchEvent(event: WatchEvent, idWidth = 0): string {
  const id = event.id.padEnd(idWidth);
  const change =
    event.kind === "present" ? (event.to ?? "") : `${event.from ?? "(new)"} -> ${event.to ?? "(removed)"}`;
  const reason = event.termination_reason ? `  (${event.termination_reason})` : "";
  // Every part is the shim's word (an id, a reason): nothing in it reaches the terminal raw.
  return escapeControls(`${event.time}  ${id}  ${change}${reason}`);
}

/** Options of {@link watchTasks}. */
export interface WatchOptions {
  readonly intervalMs: number;
  /** Report the current tasks and return. */
  readonly once: boolean;
  /** Stop after this long (0 = until interrupted). */
  readonly timeoutMs: number;
  /** Told when the shim stops and starts answering again (after the first poll). */
  readonly onReachability?: (reachable: boolean, error?: Error) => void;
  readonly clock?: LoopClock;
}

/**
 * Polls the task list and emits what changed: first every task present, then additions,
 * status changes and removals. A terminated task's reason is fetched once, when it changes.
 * The first poll must succeed; later outages are reported and waited out.
 */
export async function watchTasks(
  client: Pick<ShimClient, "listTasks" | "getTask">,
  emit: (event: WatchEvent) => void,
  options: WatchOptions,
): Promise<void> {
  const clock = options.clock ?? REAL_CLOCK;
  const deadline = options.timeoutMs > 0 ? clock.now() + options.timeoutMs : Number.POSITIVE_INFINITY;
  const stamp = (): string => new Date(clock.wallNow()).toISOString();
  const reasonOf = async (id: string): Promise<string | undefined> => {
    try {
      return (await client.getTask(id)).termination_reason || undefined;
    } catch (error) {
      // Removed between the list and this read (the removal shows up in the next poll), or
      // the shim went away (the next list reports it): the change itself is still worth a line.
      if (error instanceof ShimHttpError && error.status === 404) return undefined;
      if (error instanceof ShimUnreachableError) return undefined;
      throw error;
    }
  };

  const first = await client.listTasks();
  const known = new Map(first.map((t) => [t.id, t.status]));
  for (const { id, status } of first) emit({ time: stamp(), kind: "present", id, from: null, to: status });
  if (options.once) return;

  let reachable = true;
  while (clock.now() < deadline) {
    await clock.sleep(Math.min(options.intervalMs, Math.max(0, deadline - clock.now())));
    if (clock.now() >= deadline) return;
    let current: Awaited<ReturnType<typeof client.listTasks>>;
    try {
      current = await client.listTasks();
    } catch (error) {
      if (!(error instanceof ShimUnreachableError)) throw error;
      if (reachable) options.onReachability?.(false, error);
      reachable = false;
      continue;
    }
    if (!reachable) options.onReachability?.(true);
    reachable = true;
    for (const change of diffTaskStatuses(known, current)) {
      if (change.to === null) known.delete(change.id);
      else known.set(change.id, change.to);
      const reason = change.to === "terminated" ? await reasonOf(change.id) : undefined;
      emit({ time: stamp(), ...change, ...(reason !== undefined ? { termination_reason: reason } : {}) });
    }
  }
}

/** Options of {@link waitTerminated}: those of a start's follow. */
export type WaitOptions = FollowStartOptions;

/**
 * Waits until a task is `terminated` and returns it (`tasks wait`, and `terminate` until the
 * stop is really over). A shim restart in between is waited out as in {@link followStart}.
 */
export function waitTerminated(
  client: Pick<ShimClient, "getTask">,
  id: string,
  options: WaitOptions,
): Promise<ShimTaskInfo> {
  return pollTask(client, id, options, { done: (task) => task.status === "terminated" });
}

/** Options of {@link followEvents}. */
export interface FollowEventsOptions {
  /** Stop after this long (0 = until interrupted). */
  readonly timeoutMs: number;
  /** How long to wait before connecting again after the stream broke. */
  readonly retryMs: number;
  /** Told when the shim stops and starts answering again (after the first connection). */
  readonly onReachability?: (reachable: boolean, error?: Error) => void;
  readonly clock?: LoopClock;
}

/**
 * Follows the shim's event stream (`GET /api/events`) and emits every change as it happens:
 * no status is missed, however short. When the stream breaks (a shim restart), it connects
 * again and turns the new opening snapshot into the changes made meanwhile. The first
 * connection must succeed: an older shim without the stream answers 404, and the caller
 * falls back to {@link watchTasks}.
 */
export async function followEvents(
  client: Pick<ShimClient, "events">,
  emit: (event: WatchEvent) => void,
  options: FollowEventsOptions,
): Promise<void> {
  const clock = options.clock ?? REAL_CLOCK;
  const stop = new AbortController();
  const timer =
    options.timeoutMs > 0 ? setTimeout(() => stop.abort(new Error("timeout")), options.timeoutMs) : undefined;
  const known = new Map<string, TaskStatus>();
  let connected = false;
  let reachable = true;
  try {
    while (!stop.signal.aborted) {
      // Tasks of the previous connection not in this one's snapshot were removed meanwhile.
      const unseen = connected ? new Set(known.keys()) : undefined;
      let snapshotOver = false;
      const endSnapshot = (): void => {
        if (snapshotOver) return;
        snapshotOver = true;
        for (const id of unseen ?? []) {
          emit({
            time: new Date(clock.wallNow()).toISOString(),
            kind: "removed",
            id,
            from: known.get(id) ?? null,
            to: null,
          });
          known.delete(id);
        }
      };
      try {
        for await (const event of client.events(stop.signal)) {
          if (!reachable) options.onReachability?.(true);
          reachable = true;
          connected = true;
          if (event.kind !== "present") endSnapshot();
          else if (unseen) {
            // A snapshot after a reconnect: only what changed while the stream was down.
            unseen.delete(event.id);
            const before = known.get(event.id);
            known.set(event.id, event.to ?? "terminated");
            if (before === event.to) continue;
            emit({ ...event, kind: before === undefined ? "added" : "changed", from: before ?? null });
            continue;
          }
          if (event.to === null) known.delete(event.id);
          else known.set(event.id, event.to);
          emit(event);
        }
        // A stream cut by the stop is not a snapshot that ended.
        if (!stop.signal.aborted) endSnapshot();
      } catch (error) {
        if (!connected || !(error instanceof ShimUnreachableError)) throw error;
        if (reachable) options.onReachability?.(false, error);
        reachable = false;
      }
      if (!stop.signal.aborted) await clock.sleep(options.retryMs);
    }
  } finally {
    clearTimeout(timer);
  }
}
