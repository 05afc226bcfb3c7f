/**
 * The one bound of every graceful shutdown (SIGTERM, SIGINT, `POST /api/shutdown`, a supervisor's
 * stop): steps in flight get a grace period to finish on their own, are then interrupted through
 * their signals (an external command's process group is killed and reaped; its step is left for
 * the next start to resume), and whatever still has not settled at the bound is left behind: the
 * process exits anyway, as a `kill -9` would have cut it, which the restore is built for.
 */

/** The grace and the bound of a graceful shutdown, in ms from its request. */
export interface ShutdownTimings {
  /** Steps in flight may finish on their own this long before they are interrupted. */
  readonly graceMs: number;
  /** The process exits by then, whatever is still running. */
  readonly boundMs: number;
}

/**
 * 5 s of grace, 20 s in all: an interrupted command is killed and reaped within 5 s and its pipes
 * drained within 5 s more (`run-bounded.ts`), so the bound is reached only by a step that ignores
 * its signal. Well under systemd's `TimeoutStopSec=30` (deploy/taskshim.service), so the unit never
 * has to SIGKILL the shim.
 */
export const SHUTDOWN_TIMINGS: ShutdownTimings = { graceMs: 5_000, boundMs: 20_000 };

/** How a bounded shutdown ended. */
export type ShutdownOutcome =
  /** Every step settled within the grace: nothing was interrupted. */
  | { readonly kind: "clean"; readonly elapsedMs: number }
  /** Steps in flight were interrupted (the grace ran out, or a second request asked at once); all settled. */
  | { readonly kind: "interrupted"; readonly elapsedMs: number; readonly interruptedAtMs: number }
  /** The bound ran out: these steps had not settled and are left behind. */
  | {
      readonly kind: "deadline";
      readonly elapsedMs: number;
      readonly interruptedAtMs: number;
      readonly unfinished: readonly string[];
    };

/**
 * Runs the wait of one graceful shutdown under {@link ShutdownTimings}. `interrupt` is called at
 * most once: when the grace runs out, or earlier through {@link interruptNow}.
 */
export class ShutdownDeadline {
  private readonly startedAt: number;
  private interruptedAtMs: number | undefined;
  private readonly graceTimer: NodeJS.Timeout;

  constructor(
    readonly timings: ShutdownTimings,
    private readonly interrupt: () => void,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.startedAt = now();
    this.graceTimer = setTimeout(() => this.interruptNow(), timings.graceMs);
  }

  /** Interrupts the steps in flight now (a second signal, a forced shutdown); once only. */
  interruptNow(): void {
    clearTimeout(this.graceTimer);
    if (this.interruptedAtMs !== undefined) return;
    this.interruptedAtMs = this.elapsed();
    this.interrupt();
  }

  /**
   * Waits for every named step, at most until the bound. A step's failure counts as settled: the
   * shutdown only needs it to have stopped.
   */
  async wait(steps: Readonly<Record<string, Promise<unknown>>>): Promise<ShutdownOutcome> {
    const unfinished = new Set(Object.keys(steps));
    const all = Promise.allSettled(
      Object.entries(steps).map(([name, step]) =>
        step.then(
          () => unfinished.delete(name),
          () => unfinished.delete(name),
        ),
      ),
    );
    let boundTimer: NodeJS.Timeout | undefined;
    const bound = new Promise<"bound">((resolve) => {
      boundTimer = setTimeout(() => resolve("bound"), Math.max(0, this.timings.boundMs - this.elapsed()));
    });
    const ended = await Promise.race([all.then(() => "settled" as const), bound]);
    clearTimeout(boundTimer);
    clearTimeout(this.graceTimer);
    const elapsedMs = this.elapsed();
    if (ended === "bound") {
      return {
        kind: "deadline",
        elapsedMs,
        interruptedAtMs: this.interruptedAtMs ?? elapsedMs,
        unfinished: [...unfinished],
      };
    }
    if (this.interruptedAtMs === undefined) return { kind: "clean", elapsedMs };
    return { kind: "interrupted", elapsedMs, interruptedAtMs: this.interruptedAtMs };
  }

  private elapsed(): number {
    return Math.round(this.now() - this.startedAt);
  }
}
