/**
 * `work`, or the signal's abort as soon as it comes: the caller stops waiting for an operation
 * that may never settle (a read stuck in the kernel, a peer that stalls); the operation itself is
 * left to settle on its own, its outcome ignored, as a kill would leave it. Rejects with the
 * signal's reason, or with the work's own failure as it is.
 */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => undefined);
    return Promise.reject(signal.reason as Error);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    work.finally(() => signal.removeEventListener("abort", onAbort)).then(resolve, reject);
  });
}
