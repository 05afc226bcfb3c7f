/* Polling until a condition holds, for unit tests that watch background work. */

/** Polls `condition` until it holds; throws after `timeoutMs`. */
export async function waitFor(
  condition: () => boolean,
  options: { readonly timeoutMs?: number; readonly intervalMs?: number; readonly what?: string } = {},
): Promise<void> {
  const deadline = performance.now() + (options.timeoutMs ?? 2_000);
  while (!condition()) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${options.what ?? "condition"}`);
    await new Promise((resolve) => setTimeout(resolve, options.intervalMs ?? 2));
  }
}
