/*
 * A signal during the start. `serve` installs its SIGTERM and SIGINT handlers before anything
 * else runs, so a signal that comes while the shim still starts (a restore held by a slow engine
 * or disk) is the shim's to handle, never Node's default handler's kill: the start stops waiting,
 * releases the home lock and exits 0, the containers untouched. This module is kept small: the
 * command line loads it before the server's dependencies.
 */
import { untilAborted } from "../exec/until-aborted.js";

/** The start was interrupted by a signal before the shim served: a clean stop, not a failure. */
export class StartInterruptedError extends Error {
  override readonly name = "StartInterruptedError";
  constructor(
    /** What asked: `SIGTERM`, `SIGINT`, or `disconnect` (the supervisor's channel closed). */
    readonly by: string,
  ) {
    super(`start interrupted by ${by}`);
  }
}

/**
 * Waits for `work`, unless `signal` aborts first: then it rejects at once with the signal's
 * reason and leaves `work` behind (its outcome is ignored), as a kill would leave it; what the
 * start does is built to be cut at any point. Without a signal it is `work` itself.
 */
export function unlessInterrupted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  return signal === undefined ? work : untilAborted(work, signal);
}
