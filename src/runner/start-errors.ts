/*
 * How a start ends early: a step that failed (the task terminates with its reason) or a start
 * overtaken by a terminate, a remove or the shim's shutdown (not an error of the task).
 */
import type { TaskStore } from "../tasks/task-store.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { errorMessage } from "../errors/error-message.js";

/** A start step failed; carries the reason the task terminates with. */
export class StartStepError extends Error {
  // Stryker disable next-line StringLiteral: never leaves the start sequence (start() uses its reason and message) and pino types an error by its constructor
  override readonly name = "StartStepError";
  constructor(
    readonly reason: TerminationReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/**
 * Runs one step of a start. Its failure terminates the task with `reason` and the message
 * `<what> error: <the cause's message>` (dstack-shim's wording), or the cause's message alone
 * when `what` is undefined.
 */
export async function startStep<T>(
  reason: TerminationReason,
  what: string | undefined,
  run: () => T | Promise<T>,
): Promise<T> {
  try {
    return await run();
  } catch (cause) {
    const message = what === undefined ? errorMessage(cause) : `${what} error: ${errorMessage(cause)}`;
    throw new StartStepError(reason, message, { cause });
  }
}

/** The start was overtaken by a terminate, a remove or the shutdown; not an error of the task. */
export class StartAbandoned extends Error {
  // Stryker disable next-line StringLiteral: never leaves the start sequence (start() logs its message only)
  override readonly name = "StartAbandoned";
}

/** Throws `StartAbandoned` once the task was terminated or removed underneath the start. */
export function checkStillWanted(store: TaskStore, id: string): void {
  const current = store.get(id);
  if (!current) throw new StartAbandoned("task removed");
  if (current.status === "terminated") throw new StartAbandoned("task terminated");
}
