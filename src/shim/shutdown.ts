/*
 * How the shim process ends, in one object. It owns the shim's lifecycle (every phase change of
 * the process goes through it), the two process-wide signals the shim's work listens on, and the
 * shutdown deadline, so that "what a signal means now" is decided in one place: before the shim
 * serves, a signal stops the start; once it serves, SIGTERM, SIGINT and `POST /api/shutdown` take
 * one bounded path (lifecycle/shutdown-deadline.ts), and a second request skips the grace.
 */
import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";
import { ShimLifecycle } from "../lifecycle/shim-lifecycle.js";
import { SHUTDOWN_TIMINGS, ShutdownDeadline, type ShutdownTimings } from "../lifecycle/shutdown-deadline.js";
import type { HomeLock } from "../state/home-lock.js";
import type { LogFileSink } from "../state/log-file-sink.js";
import { StartInterruptedError } from "./start-interruption.js";

/** What a serving shim hands its shutdown: what to stop at once and what to wait for. */
export interface DrainPlan {
  /** Closes every open connection at once: a forced shutdown (`force`, at each request). */
  closeConnections(): void;
  /** Stops what needs no waiting (the heap trim, the pulls), once the shutdown signal is aborted. */
  stopNow(): void;
  /** Starts the waits the deadline bounds, by name (the log names those left unfinished). */
  steps(): Readonly<Record<string, Promise<unknown>>>;
}

/** What the shutdown releases last: the home lock, and the log's file (after a flush). */
export interface ShutdownHolds {
  readonly log: Logger;
  readonly lock: HomeLock;
  readonly logFile: LogFileSink;
}

/**
 * The end of one shim process: see the file's header. Built once the log is open (the lifecycle
 * is `starting` from then); `stopped` settles once a shutdown of the serving shim is over, by the
 * deadline's bound at the latest.
 */
export class ShimShutdown {
  /** The process's phases: moved only by this object. */
  readonly lifecycle: ShimLifecycle;
  /** Settles once the serving shim's shutdown is over (the caller then exits the process). */
  readonly stopped: Promise<void>;
  private readonly shutdownController = new AbortController();
  private readonly interruption = new AbortController();
  private readonly onStop: (() => void)[] = [];
  private resolveStopped: () => void = () => undefined;
  private start: AbortSignal | undefined;
  private plan: DrainPlan | undefined;
  private deadline: ShutdownDeadline | undefined;
  private stopping: Promise<void> | undefined;

  constructor(
    private readonly holds: ShutdownHolds,
    private readonly timings: ShutdownTimings = SHUTDOWN_TIMINGS,
  ) {
    this.lifecycle = new ShimLifecycle(holds.log);
    this.stopped = new Promise<void>((resolve) => (this.resolveStopped = resolve));
    // Every Docker call and command in flight listens on these process-wide signals (and removes
    // its listener when it settles: deadline-signal.ts), so their count follows the work in flight,
    // e.g. 16 inspects at once in a restore: Node's leak heuristic of 10 does not apply to them.
    setMaxListeners(0, this.shutdownController.signal, this.interruption.signal);
  }

  /** Aborted when a shutdown begins: what resumes cheaply (pulls, downloads, loops) ends at once. */
  get signal(): AbortSignal {
    return this.shutdownController.signal;
  }

  /** Aborted after the grace (or at once when forced): the external commands in flight are killed. */
  get interruptSignal(): AbortSignal {
    return this.interruption.signal;
  }

  /**
   * Listens to the start's signal (`serve`'s, aborted by SIGTERM or SIGINT before the shim
   * serves): what is in flight (engine calls, commands) ends at once, and the start stops waiting
   * for it (`unlessInterrupted`) and ends in {@link failStart}.
   */
  watchStart(interrupted: AbortSignal | undefined): void {
    this.start = interrupted;
    interrupted?.addEventListener("abort", this.onInterrupt, { once: true });
    if (interrupted?.aborted === true) this.onInterrupt();
  }

  /** Runs `stop` when the shim stops, before the home lock is released (a failed start too). */
  atStop(stop: () => void): void {
    this.onStop.push(stop);
  }

  /** The recovery begins (startup step 6). */
  restoring(): void {
    this.lifecycle.to("restoring");
  }

  /** The listener accepts: from here a signal is a shutdown ({@link request}), no longer a stopped start. */
  serving(): void {
    this.lifecycle.to("serving");
    this.start?.removeEventListener("abort", this.onInterrupt);
  }

  /** What the shutdown of the serving shim stops and waits for: given once its background runs. */
  drains(plan: DrainPlan): void {
    this.plan = plan;
  }

  /**
   * A graceful shutdown, as `POST /api/shutdown` and SIGINT/SIGTERM ask: one bounded path for all.
   * `force`, or a second request, interrupts the steps in flight at once instead of after the grace.
   */
  request(force: boolean): void {
    const plan = this.plan;
    // The API does not listen and signals stop the start until the shim serves.
    if (plan === undefined) throw new Error("shim shutdown requested before the shim serves");
    if (force) plan.closeConnections();
    if (this.stopping) {
      // Asked again (a second signal, a forced request): no more grace.
      this.deadline?.interruptNow();
      return;
    }
    const { log } = this.holds;
    this.lifecycle.to("draining", { force });
    log.info(
      { force, graceMs: this.timings.graceMs, boundMs: this.timings.boundMs },
      "shutting down; containers keep running",
    );
    // One path for SIGTERM, SIGINT and POST /api/shutdown: the shutdown signal ends what can
    // resume cheaply at once (pulls, downloads, the loops); after the grace the interruption
    // kills the external commands in flight (their steps resume at the next start); at the bound
    // the process exits whatever is left.
    const deadline = new ShutdownDeadline(this.timings, () =>
      this.interruption.abort(new Error("interrupted by the shim's shutdown")),
    );
    this.deadline = deadline;
    if (force) deadline.interruptNow();
    this.stopping = this.drain(deadline, plan);
  }

  /**
   * Ends a start that threw: a signal's interruption is a clean stop (`draining`, then `stopped`),
   * anything else `failed`. What is in flight is aborted, the home lock released and the log
   * closed. Returns the error the start throws: the signal's {@link StartInterruptedError} when
   * one interrupted it (whatever the step in flight then threw), else `error`.
   */
  async failStart(error: unknown): Promise<unknown> {
    const { log, lock, logFile } = this.holds;
    this.start?.removeEventListener("abort", this.onInterrupt);
    const stoppedBy = this.start?.aborted === true ? (this.start.reason as Error) : undefined;
    const interrupted = stoppedBy instanceof StartInterruptedError ? stoppedBy : undefined;
    if (interrupted) {
      this.lifecycle.to("draining", { interruptedBy: interrupted.by });
      log.info(
        { by: interrupted.by },
        "start interrupted; stopping before serving (containers keep running, the next start restores)",
      );
    } else this.lifecycle.to("failed", { error: errorMessage(error) });
    this.shutdownController.abort();
    this.interruption.abort();
    for (const stop of this.onStop) stop();
    await lock.release();
    if (interrupted) this.lifecycle.to("stopped", { outcome: "interrupted" });
    log.flush();
    logFile.close();
    return interrupted ?? error;
  }

  private readonly onInterrupt = (): void => {
    this.shutdownController.abort(new Error("shim start interrupted"));
    this.interruption.abort(new Error("shim start interrupted"));
  };

  private async drain(deadline: ShutdownDeadline, plan: DrainPlan): Promise<void> {
    const { log, lock, logFile } = this.holds;
    this.shutdownController.abort(new Error("shim shutting down"));
    plan.stopNow();
    // The API drains its open connections (up to DRAIN_TIMES) while the background jobs stop.
    const outcome = await deadline.wait(plan.steps());
    for (const stop of this.onStop) stop();
    await lock.release();
    if (outcome.kind === "deadline") {
      log.warn(
        { outcome: outcome.kind, elapsedMs: outcome.elapsedMs, unfinished: outcome.unfinished },
        "shutdown bound reached; exiting with steps unfinished (the next start resumes them)",
      );
    }
    log.info({ outcome: outcome.kind, elapsedMs: outcome.elapsedMs }, "shutdown complete");
    // Steps left behind at the bound are a shutdown that did not finish: failed, not stopped.
    this.lifecycle.to(outcome.kind === "deadline" ? "failed" : "stopped", { outcome: outcome.kind });
    log.flush();
    // Frees shim.log's descriptor; a line logged after this is still appended (LogFileSink.close).
    logFile.close();
    this.resolveStopped();
  }
}
