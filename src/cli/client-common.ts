import { readFile } from "node:fs/promises";
import { Option } from "@commander-js/extra-typings";
import {
  ShimClient,
  ShimHttpError,
  ShimProtocolError,
  ShimUnreachableError,
} from "../control/shim-client.js";
import { errorMessage } from "../errors/error-message.js";
import { FollowTimeoutError } from "./task-follow.js";
import { TaskLookupError } from "./task-lookup.js";

/*
 * What every client command shares: its --shim and --auth-token-file flags, the client they
 * make, one line for any failure, and how it prints.
 */

/** Where the client commands look for a shim unless told otherwise (dstack-shim's default port). */
export const DEFAULT_SHIM_URL = "http://127.0.0.1:10998";

/** A client command failed; the message is the one line the operator sees after `taskshim: `. */
export class CliError extends Error {
  override readonly name = "CliError";
}

/** The flags every client command has: which shim, and its token. */
export interface ConnectOptions {
  readonly shim: string;
  readonly authTokenFile?: string | undefined;
}

/** `--shim URL` (TASKSHIM_URL). */
export const shimOption = () =>
  new Option("--shim <url>", "the shim's API").env("TASKSHIM_URL").default(DEFAULT_SHIM_URL);
/** `--auth-token-file PATH` (TASKSHIM_AUTH_TOKEN_FILE). */
export const tokenOption = () =>
  new Option(
    "--auth-token-file <path>",
    "file holding the shim's bearer token (shims started with --auth-token-file)",
  ).env("TASKSHIM_AUTH_TOKEN_FILE");
/** `--json`: JSON for scripts instead of a table. */
export const jsonOption = () => new Option("--json", "print JSON (for scripts) instead of a table");

/** A client for `--shim`, with the bearer token from `--auth-token-file` if given. */
async function connect(options: ConnectOptions): Promise<ShimClient> {
  let url: URL;
  try {
    url = new URL(options.shim);
  } catch {
    throw new CliError(`invalid --shim URL ${JSON.stringify(options.shim)} (like ${DEFAULT_SHIM_URL})`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new CliError(`invalid --shim URL ${JSON.stringify(options.shim)}: use http:// or https://`);
  }
  let authToken: string | undefined;
  if (options.authTokenFile !== undefined) {
    try {
      authToken = (await readFile(options.authTokenFile, "utf8")).trim();
    } catch (error) {
      throw new CliError(`cannot read --auth-token-file: ${errorMessage(error)}`);
    }
    if (authToken === "") throw new CliError(`--auth-token-file ${options.authTokenFile} is empty`);
  }
  return new ShimClient(url.origin, 9_000, authToken === undefined ? {} : { authToken });
}

/** The task id of a `/api/tasks/{id}…` path, or undefined. */
function taskIdOfPath(path: string): string | undefined {
  const match = /^\/api\/tasks\/([^/?]+)/.exec(path);
  return match?.[1] === undefined ? undefined : decodeURIComponent(match[1]);
}

/** One line for an error of the client side; shim bodies end with a newline, removed here. */
export function describeClientError(error: unknown, shim: string): string {
  if (error instanceof ShimHttpError) {
    const id = taskIdOfPath(error.path);
    const body = error.body.trim().replace(/\s*\n\s*/g, " ");
    if (id !== undefined && error.status === 404) return `no such task: ${id} (see taskshim tasks ls)`;
    // A conflict is the shim's own sentence for the operator (`request error: cannot remove task
    // … with running status`): shown as it is, with what to do when the CLI knows it.
    if (error.status === 409 && body !== "") {
      const removing = id !== undefined && error.path.endsWith("/remove");
      const hint = removing
        ? ` (terminate it first: taskshim tasks terminate ${id}, or taskshim tasks rm --force ${id})`
        : "";
      return `${body}${hint}`;
    }
    const hint = error.status === 401 ? " (this shim needs a token: --auth-token-file FILE)" : "";
    return `${error.method} ${error.path}: HTTP ${error.status}${body ? `: ${body}` : ""}${hint}`;
  }
  if (error instanceof TaskLookupError || error instanceof FollowTimeoutError) return error.message;
  if (error instanceof ShimUnreachableError) {
    return `cannot reach the shim at ${shim}: ${error.message.replace(/^\S+: /, "")} (is it running? see --shim)`;
  }
  if (error instanceof ShimProtocolError)
    return `unexpected answer from the shim at ${shim}: ${error.message}`;
  return errorMessage(error);
}

/** Runs a command body, turning every failure into one `CliError` line. */
export async function run(
  options: ConnectOptions,
  body: (client: ShimClient) => Promise<void>,
): Promise<void> {
  const client = await connect(options);
  try {
    await body(client);
  } catch (error) {
    if (error instanceof CliError) throw error;
    throw new CliError(describeClientError(error, options.shim), { cause: error });
  }
}

/** Writes `text` to stdout as one or more lines. */
export function print(text: string): void {
  process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
}

/** Writes `value` as indented JSON. */
export function printJson(value: unknown): void {
  print(JSON.stringify(value, null, 2));
}

/** A flag parser: an integer from `min` to `max`, else a `CliError` naming the flag. */
export function positiveInt(flag: string, min = 1, max = Number.MAX_SAFE_INTEGER) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || n < min || n > max) {
      throw new CliError(`${flag}: expected an integer from ${min} to ${max}, got ${JSON.stringify(value)}`);
    }
    return n;
  };
}

/** A repeatable flag's parser: every value, in order. */
export const collect = (value: string, previous: string[]): string[] => [...previous, value];
