/**
 * The message of anything a `catch` can receive, for composing a message of our own
 * (`cannot read X: ${errorMessage(error)}`).
 *
 * - an `Error` (or anything with a string `message`, such as an error from another realm): its
 *   `message`, unchanged;
 * - a string: the string itself;
 * - anything else: `String(value)`, or `"unknown error"` when even that throws (an object without
 *   a prototype, a hostile `toString`).
 *
 * Imports nothing of the project, so every folder may use it.
 */
export function errorMessage(cause: unknown): string {
  if (cause instanceof Error) return cause.message;
  if (typeof cause === "string") return cause;
  if (
    typeof cause === "object" &&
    cause !== null &&
    "message" in cause &&
    typeof cause.message === "string"
  ) {
    return cause.message;
  }
  try {
    return String(cause);
  } catch {
    return "unknown error";
  }
}
