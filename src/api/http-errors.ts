import { errorMessage } from "../errors/error-message.js";
/**
 * An error with an HTTP status whose message is safe to send as the plain-text body
 * (dstack-shim's `api.Error`).
 */
export class HttpError extends Error {
  override readonly name = "HttpError";
  constructor(
    readonly statusCode: number,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** The body limit of every request (dstack-shim's MaxBytesReader). */
export const BODY_LIMIT_BYTES = 1024 * 1024;

/**
 * Decodes a JSON body with dstack-shim's rules: a Content-Type other than application/json
 * is 415 (a missing one is accepted), an empty body is 400, bad JSON is 400, and a body must
 * be a single value.
 */
export function decodeJsonBody(contentType: string | undefined, raw: Buffer | undefined): unknown {
  if (contentType !== undefined) {
    const mediaType = contentType.split(";")[0]?.trim().toLowerCase();
    if (mediaType !== "application/json")
      throw new HttpError(415, "Content-Type header is not application/json");
  }
  if (!raw || raw.length === 0) throw new HttpError(400, "Request body must not be empty");
  const text = raw.toString("utf8");
  if (text.trim() === "") throw new HttpError(400, "Request body must not be empty");
  try {
    return JSON.parse(text) as unknown;
  } catch (cause) {
    const position = /position (\d+)/.exec(errorMessage(cause))?.[1];
    throw new HttpError(
      400,
      position === undefined
        ? "Request body contains badly-formed JSON"
        : `Request body contains badly-formed JSON (at position ${position})`,
      { cause },
    );
  }
}

/** Reads a required object body. */
export function decodeObjectBody(
  contentType: string | undefined,
  raw: Buffer | undefined,
): Record<string, unknown> {
  const value = decodeJsonBody(contentType, raw);
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new HttpError(400, "Request body must be a JSON object");
  }
  return value as Record<string, unknown>;
}
