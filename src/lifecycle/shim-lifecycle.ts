/**
 * The shim process's own lifecycle, kept the way task statuses are: an explicit union and a
 * table of the transitions allowed, each made once and logged once.
 *
 * ```text
 * starting ──► restoring ──► serving ──► draining ──► stopped
 *    │             │            │            │
 *    └─────────────┴────────────┴────────────┴──────► failed
 *
 * starting, restoring ──► draining          (a signal before serving)
 * ```
 *
 * `starting` builds the parts and takes the home lock; `restoring` is the recovery (tasks read
 * back, exits while down finalized, host keys and starts resumed); `serving` begins once the
 * listener accepts requests; `draining` is a shutdown in progress (listener closed, starts in
 * flight given their grace, then interrupted); `stopped` is a shutdown whose steps all settled
 * within its bound. `failed` is a start that could not finish or a shutdown that reached its bound
 * with steps unfinished. A signal (SIGTERM, SIGINT) before `serving` stops the start: `draining`
 * (the start stops waiting for the step in flight, which a kill could cut as well), the home lock
 * released, then `stopped`; no request can ask for that, the API not being served yet.
 */
export type ShimPhase = "starting" | "restoring" | "serving" | "draining" | "stopped" | "failed";

/** Every phase, in lifecycle order (for metrics that export one series per phase). */
export const SHIM_PHASES: readonly ShimPhase[] = [
  "starting",
  "restoring",
  "serving",
  "draining",
  "stopped",
  "failed",
];

const NEXT: Readonly<Record<ShimPhase, readonly ShimPhase[]>> = {
  // A signal before serving stops the start cleanly: draining, then stopped.
  starting: ["restoring", "draining", "failed"],
  restoring: ["serving", "draining", "failed"],
  serving: ["draining", "failed"],
  draining: ["stopped", "failed"],
  stopped: [],
  failed: [],
};

/** A transition the table does not allow: a bug in the caller, never an input error. */
export class IllegalShimTransitionError extends Error {
  constructor(
    readonly from: ShimPhase,
    readonly to: ShimPhase,
  ) {
    super(`shim lifecycle: ${from} → ${to} is not a transition`);
    this.name = "IllegalShimTransitionError";
  }
}

/** Where transitions are logged (the shim's pino logger fits). */
export interface PhaseLogger {
  info(fields: Record<string, unknown>, message: string): void;
  error(fields: Record<string, unknown>, message: string): void;
}

/** The phase and since when, as the healthcheck and `taskshim status` show it. */
export interface ShimPhaseView {
  readonly phase: ShimPhase;
  /** ISO 8601 time of the transition into `phase`. */
  readonly since: string;
}

/** The lifecycle of one shim process: see {@link ShimPhase}. */
export class ShimLifecycle {
  private current: ShimPhase = "starting";
  private sinceMs: number;
  private readonly listeners = new Set<(view: ShimPhaseView) => void>();

  constructor(
    private readonly log: PhaseLogger,
    /** Wall clock: it only stamps `since`, which users see; nothing is timed with it. */
    private readonly now: () => number = Date.now,
  ) {
    this.sinceMs = now();
  }

  /** The current phase. */
  get phase(): ShimPhase {
    return this.current;
  }

  /** The current phase and since when. */
  get view(): ShimPhaseView {
    return { phase: this.current, since: new Date(this.sinceMs).toISOString() };
  }

  /**
   * Moves to `next` and logs it once (`failed` at error level), with `detail` in the log line.
   * Throws {@link IllegalShimTransitionError} for a move the table does not allow.
   */
  to(next: ShimPhase, detail: Record<string, unknown> = {}): void {
    if (!this.may(next)) throw new IllegalShimTransitionError(this.current, next);
    const from = this.current;
    this.current = next;
    this.sinceMs = this.now();
    const fields = { phase: next, from, ...detail };
    if (next === "failed") this.log.error(fields, "shim phase");
    else this.log.info(fields, "shim phase");
    const view = this.view;
    for (const listener of this.listeners) listener(view);
  }

  /** Calls `listener` after every transition; returns the function that unsubscribes it. */
  onChange(listener: (view: ShimPhaseView) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private may(next: ShimPhase): boolean {
    return NEXT[this.current].includes(next);
  }
}
