/** The error `fn` throws, for a test to read its name, message and cause; fails if it returns. */
export function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (error) {
    return error as Error;
  }
  throw new Error("did not throw");
}

/** The error `run` rejects with, as {@link thrown} for a promise; fails if it resolves or rejects with a non-Error. */
export async function rejected(run: Promise<unknown>): Promise<Error> {
  const outcome = await run.then(
    () => ({ resolved: true as const }),
    (error: unknown) => ({ resolved: false as const, error }),
  );
  if (outcome.resolved) throw new Error("did not reject");
  if (!(outcome.error instanceof Error))
    throw new Error(`rejected with a non-Error: ${String(outcome.error)}`);
  return outcome.error;
}
