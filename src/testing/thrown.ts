/** The error `fn` throws, for a test to read its name, message and cause; fails if it returns. */
export function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (error) {
    return error as Error;
  }
  throw new Error("did not throw");
}
