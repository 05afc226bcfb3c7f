/**
 * A deadline shared by every step of one operation (for example: a removal that may
 * have to list, remove and then poll). Each attempt may be capped further, but never
 * extended past the operation's own deadline.
 *
 * Counted on the monotonic clock (`performance.now()`): a wall clock stepped by NTP or an
 * operator would otherwise expire a deadline at once (stepped forward) or hold it for the
 * size of the step (stepped back).
 */
export class OperationBound {
  private readonly startedAt: number;

  private constructor(
    private readonly deadlineAt: number | undefined,
    now: number,
  ) {
    this.startedAt = now;
  }

  /** An operation with no deadline (only an attempt cap or an interruption ends it). */
  static unbounded(): OperationBound {
    return new OperationBound(undefined, performance.now());
  }

  /** An operation that must finish within `ms` milliseconds from now. */
  static within(ms: number): OperationBound {
    const now = performance.now();
    return new OperationBound(now + Math.max(0, ms), now);
  }

  /** Whole milliseconds since the operation began (evidence fields are integers). */
  elapsedMs(): number {
    return Math.round(performance.now() - this.startedAt);
  }

  /**
   * The time left for one attempt: the smaller of the operation's remainder and `capMs`.
   * `undefined` means unbounded; 0 means already expired.
   */
  remainingMs(capMs?: number): number | undefined {
    // Whole milliseconds, rounded up: a timer set for the remainder never fires before it.
    const left =
      this.deadlineAt === undefined ? undefined : Math.max(0, Math.ceil(this.deadlineAt - performance.now()));
    if (capMs === undefined) return left;
    return left === undefined ? Math.max(0, capMs) : Math.min(left, Math.max(0, capMs));
  }

  /** True once the operation's own deadline has passed. */
  expired(): boolean {
    return this.remainingMs() === 0;
  }
}
