/**
 * A per-call deadline linked to a long-lived signal (the shim's shutdown): the signal a call is
 * given aborts when the parent does, with the parent's reason, or when the deadline passes.
 *
 * The link is `AbortSignal.any`. Node 20 kept one dependant per call on the parent for as long as
 * the parent lived (nodejs/node#55351), so a reconcile loop linking every engine call to the
 * shutdown signal grew without bound and this module was a hand-written copy; the pinned Node.js
 * 26 releases them (deadline-signal.test.ts: a million calls on one parent, flat heap).
 *
 * The deadline is a timer cleared when the call settles, not `AbortSignal.timeout`: that one
 * cannot be cancelled, so a call that answers in 2 ms would keep its timer and both signals alive
 * for the full deadline (measured on Node 26: ~790 bytes per call, 8 MB at 1,000 calls/s under
 * 10 s deadlines).
 */
export interface DeadlineSignal extends Disposable {
  readonly signal: AbortSignal;
  /** Clears the deadline's timer; call it (or use `using`) when the guarded call settles. */
  dispose(): void;
}

/** Raised as the abort reason when a deadline passes. */
export class DeadlineExceededError extends Error {
  override readonly name = "DeadlineExceededError";
  readonly timeoutMs: number;
  constructor(timeoutMs: number) {
    super(`deadline of ${timeoutMs} ms exceeded`);
    this.timeoutMs = timeoutMs;
  }
}

/** A signal that aborts with `parent` (if any) or after `timeoutMs` (if given). */
export function deadlineSignal(parent: AbortSignal | undefined, timeoutMs?: number): DeadlineSignal {
  const own = new AbortController();
  const timer =
    timeoutMs === undefined || parent?.aborted
      ? undefined
      : setTimeout(() => own.abort(new DeadlineExceededError(timeoutMs)), timeoutMs).unref();
  const signal = parent ? AbortSignal.any([parent, own.signal]) : own.signal;
  const dispose = (): void => clearTimeout(timer);
  return { signal, dispose, [Symbol.dispose]: dispose };
}

/** Runs `fn` with a deadline signal and clears the deadline when `fn` settles. */
export async function withDeadline<T>(
  parent: AbortSignal | undefined,
  timeoutMs: number | undefined,
  fn: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  using deadline = deadlineSignal(parent, timeoutMs);
  return await fn(deadline.signal);
}
