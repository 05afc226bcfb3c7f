import { DeadlineExceededError } from "../exec/deadline-signal.js";

/** How a {@link createUnderDeadline} is bounded, and what becomes of an answer that came late. */
export interface LateCreateOptions<T> {
  /** The caller's deadline: past it, the caller hears {@link DeadlineExceededError}. */
  readonly timeoutMs: number;
  /**
   * How long the request may run in all before it is aborted after all (then nothing is learnt
   * of it); a wedged engine must not hold a socket for ever.
   */
  readonly lateBoundMs: number;
  /** The caller's own signal (the shutdown): it aborts the request at any time. */
  readonly parent?: AbortSignal | undefined;
  /** Given what a request that answered after its deadline created, so that it can be undone. */
  readonly onLate: (value: T) => Promise<void>;
}

/** What {@link createUnderDeadline} returns. */
export interface LateCreate<T> {
  /** The request's answer, or its error, or `DeadlineExceededError` once the deadline passed. */
  readonly answer: Promise<T>;
  /**
   * Settles once the request has ended and, when it answered after its deadline, `onLate` has
   * run. Never rejects: `onLate` reports its own failures.
   */
  readonly settled: Promise<void>;
}

const EXPIRED = Symbol("expired");

/**
 * Runs a creating request under a deadline that does not cancel it. An aborted create may still
 * have been carried out by the engine (the request was sent; the engine does not undo it when the
 * client hangs up), and the id of what it created would then never be known: an orphan nobody
 * removes. So when the deadline passes the caller hears `DeadlineExceededError` at once, while
 * the request runs on (until `parent` aborts or `lateBoundMs`); an answer that arrives late is
 * handed to `onLate`, which removes what it created.
 */
export function createUnderDeadline<T>(
  request: (signal: AbortSignal) => Promise<T>,
  options: LateCreateOptions<T>,
): LateCreate<T> {
  const own = new AbortController();
  const { parent } = options;
  const onParent = (): void => own.abort(parent?.reason);
  parent?.addEventListener("abort", onParent, { once: true });
  if (parent?.aborted) onParent();
  const lateBound = setTimeout(
    () => own.abort(new DeadlineExceededError(options.lateBoundMs)),
    options.lateBoundMs,
  );
  const running = request(own.signal).finally(() => {
    clearTimeout(lateBound);
    parent?.removeEventListener("abort", onParent);
  });

  let deadline: NodeJS.Timeout | undefined;
  const expired = new Promise<typeof EXPIRED>((resolve) => {
    deadline = setTimeout(() => resolve(EXPIRED), options.timeoutMs);
  });
  const first = Promise.race([running, expired]).finally(() => clearTimeout(deadline));

  const answer = first.then((value) => {
    if (value === EXPIRED) throw new DeadlineExceededError(options.timeoutMs);
    return value;
  });
  const settled = first.then(
    async (value) => {
      if (value !== EXPIRED) return;
      const late = await running.then(
        (created) => ({ created }),
        () => undefined,
      );
      if (late) await options.onLate(late.created).catch(() => undefined);
    },
    () => undefined,
  );
  return { answer, settled };
}
