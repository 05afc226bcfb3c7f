import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";

/**
 * An expected failure (a task's bad config, an engine outage, a failed download) as log fields:
 * the message alone. Our wrapping errors already carry their cause's message, so pino's `err`
 * serializer, which appends every cause's message again, would repeat it; and a stack trace
 * says nothing an operator can act on.
 */
export function errorFields(error: unknown): { readonly error: string } {
  return { error: errorMessage(error) };
}

/**
 * Logs an expected failure at `level` with its message only, and the full error (stack and
 * causes) at debug, for a developer who asks for it.
 */
export function logExpected(
  log: Logger,
  level: "info" | "warn" | "error",
  fields: Record<string, unknown>,
  error: unknown,
  message: string,
): void {
  log[level]({ ...fields, ...errorFields(error) }, message);
  if (log.isLevelEnabled("debug")) log.debug({ ...fields, err: error }, `${message} (details)`);
}
