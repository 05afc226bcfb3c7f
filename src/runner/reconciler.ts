import { EngineMismatchError } from "./engine-guard.js";
import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import type { ContainerEvent, TaskContainerSummary } from "../docker/docker-client.js";
import type { Task } from "../tasks/task.js";
import { LAST_LOG_LINES, type RunnerContext } from "./runner-context.js";
import type { TaskRunner } from "./task-runner.js";
import { logExpected } from "../logging/log-fields.js";

/**
 * How often the safety-net list starts (fixed rate: a slow tick does not push the next one
 * back). Under a second so that, with the event stream lost, an exit is still final within
 * 1.1 s: the engine itself needs 50-200 ms after the exit before its list shows it.
 */
export const RECONCILE_INTERVAL_MS = 850;
/** Tasks a tick works on at once (inspect, log tail, commit, release of exited containers). */
const TICK_CONCURRENCY = 8;
/** The least pause between two ticks, so a slow engine is not listed back to back. */
const MIN_TICK_GAP_MS = 200;
/** With no task to reconcile, the engine is still pinged this often, so health stays honest. */
const IDLE_PROBE_MS = 5_000;
/** Back-off before reconnecting a dropped event stream. */
const EVENTS_RECONNECT_MS = 1_000;

/** The engine's health as the reconciler last saw it; `since` is wall-clock ms, shown to users. */
export type EngineHealth =
  | { readonly state: "unknown" }
  | { readonly state: "up"; readonly since: number }
  | { readonly state: "down"; readonly since: number; readonly error: string };

/** Statistics of the reconcile loop, for metrics and benchmarks. */
export interface ReconcileStats {
  ticks: number;
  lastTickMs: number;
  finalized: number;
}

/**
 * Turns container state into task state. It alone finalizes tasks, it works the same on the
 * first tick after a restart as on any other, and a missing answer from Docker is never read
 * as an exit: on an error the task simply waits for the next tick.
 */
export class Reconciler {
  private wake: (() => void) | undefined;
  // Stryker disable next-line BooleanLiteral: run() resets it before its first tick; nothing reads it earlier.
  private kicked = false;
  /** Tasks an event said changed: inspected even if the list still says running. */
  private readonly suspects = new Set<string>();
  /** Event-driven inspections in flight; awaited when the loop stops. */
  private readonly fastPath = new Set<Promise<void>>();
  private health: EngineHealth = { state: "unknown" };
  /** Monotonic ms (`performance.now()`) of the last list or ping: the idle probe's rate limit. */
  private lastProbeAt = Number.NEGATIVE_INFINITY;
  /**
   * Wall-clock ms of when the engine last answered, and of the last window in which it did not.
   * Wall clock on purpose: the window is compared with a container's `FinishedAt`, which the
   * engine stamps on the wall clock; a monotonic window could not be compared with it.
   */
  private lastUpAt = 0;
  private outage: { readonly from: number; readonly to: number } | undefined;
  readonly stats: ReconcileStats = { ticks: 0, lastTickMs: 0, finalized: 0 };

  constructor(
    private readonly ctx: RunnerContext,
    private readonly runner: TaskRunner,
  ) {}

  /** The engine health seen by the last tick. */
  engineHealth(): EngineHealth {
    return this.health;
  }

  /**
   * Asks for a tick as soon as possible. With a task id (an event said its container died),
   * that task is inspected even if the list still says running: the engine emits "die"
   * before its list view catches up. With the `die` event itself, an exit code 0 of the task's
   * own container finalizes the task at once, without an inspect (see `processRunning`).
   */
  kick(taskId?: string, event?: ContainerEvent): void {
    if (taskId !== undefined) {
      this.suspects.add(taskId);
      // Fast path: settle that task now, without waiting for a tick or listing everything.
      // If a tick holds its lock, the suspect stays in the set for the next tick.
      const task = this.ctx.store.get(taskId);
      if (task?.status === "running" && !this.ctx.shutdown.aborted) {
        // Stryker disable next-line BooleanLiteral: with no list entry the state is undefined, suspect or not.
        const work = this.processTask(taskId, undefined, true, event).finally(() =>
          this.fastPath.delete(work),
        );
        this.fastPath.add(work);
      }
    }
    this.kicked = true;
    this.wake?.();
  }

  /**
   * One pass: one labelled list, and an inspect only for containers no longer running.
   * `listed`: a list taken a moment ago (the restore's, at startup) to use instead of a new one.
   */
  async tick(listed?: readonly TaskContainerSummary[]): Promise<void> {
    const started = performance.now();
    this.stats.ticks++;
    try {
      const candidates = this.ctx.store
        .list()
        .filter(
          (t) =>
            !t.startInFlight &&
            watched(t) &&
            (t.status === "running" || (t.status === "terminated" && !t.cleanedUp)),
        );
      if (candidates.length === 0) {
        if (performance.now() - this.lastProbeAt >= IDLE_PROBE_MS) await this.probe();
        return;
      }
      let containers: readonly TaskContainerSummary[];
      try {
        containers = listed ?? (await this.ctx.docker.listTaskContainers(this.ctx.shutdown));
        this.markUp();
      } catch (error) {
        this.markDown(error as Error);
        return;
      }
      // Another engine answers: its list says nothing of this home's containers. Nothing is
      // acted on until the bound one answers again (read again at most every tick).
      const guard = this.ctx.engineGuard;
      if (guard?.mismatched()) {
        const back = await guard.verify(this.ctx.shutdown).then(
          () => true,
          () => false,
        );
        if (!back) return;
        containers = await this.ctx.docker.listTaskContainers(this.ctx.shutdown);
      }
      // Only this shim's containers (the one ownership rule); a container of another home that
      // carries a task id of ours must never stand in for our task's own container.
      const byTask = new Map<string, TaskContainerSummary>();
      for (const c of this.ctx.ownership.filter(containers, (id) => this.ctx.store.get(id) !== undefined)) {
        const own = this.ctx.store.get(c.taskId)?.containerId;
        if (own === undefined || own === c.id) byTask.set(c.taskId, c);
      }
      const suspects = new Set(this.suspects);
      this.suspects.clear();
      // Exits that land together are finalized together, not one after another.
      await pLimit(TICK_CONCURRENCY).map(candidates, async (task) => {
        if (!this.ctx.shutdown.aborted)
          await this.processTask(task.id, byTask.get(task.id), suspects.has(task.id));
      });
    } finally {
      this.stats.lastTickMs = performance.now() - started;
      this.ctx.observer?.tickDone(this.stats.lastTickMs / 1000);
    }
  }

  private async probe(): Promise<void> {
    try {
      await this.ctx.docker.ping(this.ctx.shutdown);
      this.markUp();
    } catch (error) {
      this.markDown(error as Error);
    }
  }

  private markUp(): void {
    // Wall clock: `since` is shown to users and the outage window is compared with FinishedAt.
    const now = Date.now();
    this.ctx.observer?.engineSeen(true);
    this.lastProbeAt = performance.now();
    if (this.health.state === "down") {
      this.ctx.log.info("docker engine reachable again");
      this.outage = { from: this.lastUpAt, to: now };
    }
    if (this.health.state !== "up") this.health = { state: "up", since: now };
    this.lastUpAt = now;
  }

  private markDown(error: Error): void {
    this.ctx.observer?.engineSeen(false);
    this.ctx.engineGuard?.engineDown();
    this.lastProbeAt = performance.now();
    if (this.health.state !== "down") {
      logExpected(this.ctx.log, "error", {}, error, "docker engine unreachable; tasks keep their status");
      this.health = { state: "down", since: Date.now(), error: error.message };
    }
  }

  private async processTask(
    id: string,
    listed: TaskContainerSummary | undefined,
    suspect: boolean,
    event?: ContainerEvent,
  ): Promise<void> {
    const { store, log } = this.ctx;
    const unlock = store.tryLock(id);
    if (!unlock) return;
    try {
      const task = store.get(id);
      if (!task || task.startInFlight || !watched(task)) return;
      if (task.status === "running") await this.processRunning(task, suspect ? undefined : listed, event);
      else if (task.status === "terminated" && !task.cleanedUp) await this.processTerminated(task, listed);
    } catch (error) {
      // The guard said it once; every tick waits for the bound engine from now on.
      if (error instanceof EngineMismatchError) return;
      logExpected(log, "warn", { taskId: id }, error, "reconcile of task failed; retrying next tick");
    } finally {
      unlock();
    }
  }

  private async processRunning(
    task: Task,
    listed: TaskContainerSummary | undefined,
    event?: ContainerEvent,
  ): Promise<void> {
    const { docker } = this.ctx;
    const state = listed?.state;
    if (task.terminationReason !== "") {
      // A terminate's intent with no terminate in flight (it would hold the lock): its stop was
      // cut by a restart, or failed. Finish it; the outcome keeps the requested reason (the
      // store keeps the first reason), the exit code is the container's.
      if (state !== "exited" && state !== "dead") {
        await docker.stopContainer(task.containerId ?? task.containerName, 0, this.ctx.shutdown);
      }
    } else if (state === "running" || state === "paused" || state === "restarting") return;
    // The engine's `die` event carries the exit code. Exit 0 of this task's own container is
    // final as it stands (its restart policy is "no"; done_by_runner has no message, notes or
    // log lines), so it is committed without the inspect, which was most of the shim's share of
    // exit detection. Any other exit is inspected for its OOM flag, finish time and last log
    // lines: dstack reads termination_message once, with the status.
    if (event?.action === "die" && event.exitCode === 0 && event.containerId === task.containerId) {
      await this.finalize(task, "done_by_runner", "", 0);
      return;
    }
    // Listed as exited (the first tick after a restart, or an exit whose event was lost): the
    // last log lines a failed exit needs are asked beside the inspect, not after it, so each exit
    // while down costs one round trip to the engine instead of two. An exit 0 does not read them.
    const tail =
      listed !== undefined && (state === "exited" || state === "dead") ? this.logTail(listed.id) : undefined;
    // Not listed, no longer running, or reported dead by an event: an inspect decides.
    const details = await docker.inspectContainer(task.containerId ?? task.containerName, this.ctx.shutdown);
    if (!details) {
      await this.finalize(task, "executor_error", "container not found", null);
      return;
    }
    switch (details.state) {
      case "running":
      case "paused":
      case "restarting":
        return;
      case "created":
        await this.finalize(task, "executor_error", "container was not started", null);
        return;
      case "exited":
      case "dead":
      case "removing": {
        const finishedAt = Date.parse(details.finishedAt);
        // The container's own finish time: an exit seen only after a shim restart keeps it.
        const when = Number.isFinite(finishedAt) && finishedAt > 0 ? finishedAt : undefined;
        if (details.exitCode === 0) {
          await this.finalize(task, "done_by_runner", "", 0, when);
          return;
        }
        const lines = await (details.id === listed?.id && tail ? tail : this.logTail(details.id));
        // A container that stopped while the engine was down or restarting was most likely
        // stopped by the engine (no live-restore), not by its workload: say so. Both sides are
        // wall clock (FinishedAt is the engine's), so this one comparison stays off the
        // monotonic clock.
        const duringOutage =
          this.outage !== undefined && finishedAt >= this.outage.from - 1_000 && finishedAt <= this.outage.to;
        const notes = [
          ...(duringOutage
            ? [
                `the docker engine was down or restarting when the container stopped (exit code ${details.exitCode})`,
              ]
            : []),
          ...(task.acrossReboot
            ? [`the host rebooted while the task was running (exit code ${details.exitCode})`]
            : []),
          ...(details.oomKilled ? ["container was OOM-killed"] : []),
        ];
        const message = [...notes, ...lines].join("\n").slice(-4096);
        await this.finalize(task, "container_exited_with_error", message, details.exitCode, when);
        return;
      }
    }
  }

  /** The container's last log lines; none when the engine cannot give them (never an error). */
  private logTail(containerId: string): Promise<string[]> {
    return this.ctx.docker.containerLogTail(containerId, LAST_LOG_LINES, this.ctx.shutdown).catch(() => []);
  }

  private async processTerminated(task: Task, listed: TaskContainerSummary | undefined): Promise<void> {
    const { docker } = this.ctx;
    if (
      listed &&
      (listed.state === "running" || listed.state === "paused" || listed.state === "restarting")
    ) {
      // Terminated while the start was starting it, or the stop was cut by a restart.
      await docker.stopContainer(listed.id, 0, this.ctx.shutdown);
    }
    if (task.exitCode === undefined && listed) {
      const details = await docker.inspectContainer(listed.id, this.ctx.shutdown);
      if (details && details.state !== "running" && details.state !== "created") {
        await this.runner.commit(task.id, (d) => (d.exitCode = details.exitCode));
      }
    }
    await this.runner.release(task.id);
  }

  private async finalize(
    task: Task,
    reason: "executor_error" | "done_by_runner" | "container_exited_with_error",
    message: string,
    exitCode: number | null,
    finishedAt?: number,
  ): Promise<void> {
    // The terminal status is visible at once and durable before the release starts. It is the
    // container's own outcome, which stays on record until the control plane removes the task:
    // a crash before the write re-derives the same status at restart, and a crash after it
    // re-runs only the (idempotent) release. Waiting for the write before showing it would add
    // the two fsyncs (p50 3-7 ms on ext4 beside the engine's own teardown writes) to every exit.
    const done = await this.runner.commit(task.id, (d) => {
      d.status = "terminated";
      d.terminationReason = reason;
      d.terminationMessage = message;
      d.exitCode = exitCode;
      if (finishedAt !== undefined) d.finishedAt = finishedAt;
    });
    // A terminate's intent keeps its reason (the store keeps the first): that is the outcome.
    const final = done.terminationReason === "" ? reason : done.terminationReason;
    this.stats.finalized++;
    this.ctx.observer?.taskFinalized(final);
    this.ctx.log.info({ taskId: task.id, reason: final, exitCode }, "task finished");
    await this.runner.release(task.id);
  }

  /** Ticks every RECONCILE_INTERVAL_MS (or at once when kicked) until the shutdown signal aborts. */
  async run(): Promise<void> {
    const { shutdown, log } = this.ctx;
    while (!shutdown.aborted) {
      this.kicked = false;
      const started = performance.now();
      await this.tick().catch((error: unknown) => log.error({ err: error }, "reconcile tick failed"));
      if (this.kicked || shutdown.aborted) continue;
      const wait = Math.max(MIN_TICK_GAP_MS, RECONCILE_INTERVAL_MS - (performance.now() - started));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, wait);
        function done(): void {
          // Stryker disable next-line CallExpression: a timer left to fire only repeats this idempotent settle.
          clearTimeout(timer);
          shutdown.removeEventListener("abort", done);
          resolve();
        }
        this.wake = done;
        // Stryker disable next-line ObjectLiteral,BooleanLiteral: done() removes the listener itself.
        shutdown.addEventListener("abort", done, { once: true });
      });
      this.wake = undefined;
    }
    await this.settled();
  }

  /**
   * Resolves once the fast paths started so far (by `kick`) are done. Both loops end with it,
   * so that no finalize or release is still writing when they return.
   */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.fastPath]);
  }

  /**
   * Follows the engine's event stream and kicks a tick when a task container dies, so an exit
   * is seen in milliseconds; the periodic list remains the safety net. A dropped stream reconnects.
   * Returns at shutdown, once what its events started is done.
   */
  async followEvents(): Promise<void> {
    const { docker, shutdown, log } = this.ctx;
    while (!shutdown.aborted) {
      try {
        for await (const event of docker.containerEvents(shutdown)) {
          log.debug({ taskId: event.taskId, action: event.action }, "container event");
          // Stryker disable next-line StringLiteral: the ownership rule reads the owner and task id, not the name.
          const facts = { id: event.containerId, name: "", taskId: event.taskId, owner: event.owner };
          if (!this.ctx.ownership.isOurs(facts, (id) => this.ctx.store.get(id) !== undefined)) continue;
          if (event.action === "die" || event.action === "destroy" || event.action === "oom")
            this.kick(event.taskId, event);
        }
      } catch (error) {
        if (!shutdown.aborted) log.debug({ err: error }, "docker event stream dropped; reconnecting");
      }
      if (shutdown.aborted) break;
      // Events may have been missed while disconnected: let the list catch up.
      this.kick();
      await sleep(EVENTS_RECONNECT_MS, undefined, { signal: shutdown }).catch(() => undefined);
    }
    await this.settled();
  }
}

/**
 * Whether the reconciler looks at a task. A held task (`TaskHold`: a newer release's, or one
 * whose state file could not be quarantined) is only watched, and only while it runs in a
 * container with no terminate pending: its status follows the container in memory (Docker is
 * the truth about containers), and nothing is stopped, written or released. One without a
 * container, one with a pending terminate, and one whose status this version does not know is
 * not looked at: it is shown as its file says.
 */
function watched(task: Task): boolean {
  const { held } = task;
  if (held === undefined) return true;
  return (
    held.kind !== "newer-status" &&
    task.containerId !== undefined &&
    task.status === "running" &&
    task.terminationReason === ""
  );
}
