import { constants as osConstants } from "node:os";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { Static, TSchema } from "typebox";
import Value from "typebox/value";
import { decodeObjectBody, HttpError } from "./http-errors.js";

/*
 * How every route reads a body and writes an answer: JSON text as it is, plain text (every
 * error) as one line, bodies decoded with dstack-shim's rules and checked against their schema.
 */

/** Sends JSON text serialized beforehand (fastify sends a string as it is). */
export function sendJson(reply: FastifyReply, json: string): FastifyReply {
  return reply.header("content-type", "application/json; charset=utf-8").send(json);
}

/**
 * A plain-text answer. An error's message is cut to one line without errno codes, unless it is
 * `verbatim`: a message the API composes on purpose, such as `storage unavailable: ENOSPC: …`,
 * whose errno name is the operator's answer.
 */
export function sendText(
  reply: FastifyReply,
  status: number,
  message: string,
  options: { verbatim?: boolean } = {},
): FastifyReply {
  const text = status < 400 ? message : options.verbatim ? firstLine(message) : oneLineMessage(message);
  return reply
    .code(status)
    .header("content-type", "text/plain; charset=utf-8")
    .header("x-content-type-options", "nosniff")
    .send(`${text}\n`);
}

/** A request's body as an object (dstack-shim's rules), checked against `schema` if given. */
export function readBody(request: FastifyRequest): Record<string, unknown>;
export function readBody<T extends TSchema>(request: FastifyRequest, schema: T): Static<T>;
export function readBody(request: FastifyRequest, schema?: TSchema): unknown {
  const decoded = decodeObjectBody(request.headers["content-type"], request.body as Buffer | undefined);
  if (schema) checkBody(schema, decoded);
  return decoded;
}

/**
 * Checks a decoded body against its schema; the first bad field gets dstack-shim's message.
 */
export function checkBody<T extends TSchema>(schema: T, body: Record<string, unknown>): void {
  if (Value.Check(schema, body)) return;
  const first = Value.Errors(schema, body).find((e) => e.instancePath !== "");
  const field = (first?.instancePath ?? "").split("/").filter(Boolean).join(".");
  throw new HttpError(400, `Request body contains an invalid value for the "${field}" field`);
}

/** The `:id` of a task route. */
export const taskIdParam = (request: FastifyRequest): string => (request.params as { id: string }).id;

function firstLine(message: string): string {
  return message.split(/\r?\n/)[0] ?? "";
}

/** The errno names this platform knows (`ENOENT`, `ECONNREFUSED`…) and Node's `ERR_…` codes. */
const ERRNO_CODES = new RegExp(`\\b(?:${Object.keys(osConstants.errno).join("|")}|ERR_[A-Z0-9_]+)\\b:?`, "g");

/**
 * An error message as the API may send it: its first line, without errno codes (`ENOENT`,
 * `ERR_…`) or anything that looks like a stack frame.
 */
export function oneLineMessage(message: string): string {
  return firstLine(message)
    .replace(/\s+at\s+\S+\s+\(.*$/, "")
    .replace(ERRNO_CODES, "")
    .replace(/\s{2,}/g, " ")
    .trim();
}
