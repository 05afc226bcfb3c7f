/*
 * The first three steps of the start (docs/architecture.md, "Startup"): every cheap precondition
 * before anything is touched, the home's lock, the log. Each fails in one line for the operator.
 */
import { mkdir, readFile, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import type { Logger } from "pino";
import { ConfigError, type ShimConfig } from "../config/shim-config.js";
import { errorMessage } from "../errors/error-message.js";
import { armFailpoints } from "../runner/failpoints.js";
import { acquireHomeLock, type HomeLock } from "../state/home-lock.js";
import { narrowLogFileMode, type LogFileSink } from "../state/log-file-sink.js";
import {
  inspectInheritedSocket,
  listenTarget,
  SocketActivationError,
  type ListenTarget,
} from "./listen-target.js";
import { createLogger } from "./shim-logger.js";

/** Startup could not complete; the message is one line for the operator. */
export class StartupError extends Error {
  override readonly name = "StartupError";
}

async function readAuthToken(file: string): Promise<string | undefined> {
  if (file === "") return undefined;
  let token: string;
  try {
    // As sshd with its keys: a secret others may read is refused, with the fix named.
    const mode = (await stat(file)).mode;
    if ((mode & 0o077) !== 0) {
      throw new ConfigError(
        `the auth token file ${file} is accessible by group or others: chmod 600 ${file}`,
      );
    }
    token = (await readFile(file, "utf8")).trim();
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(`cannot read the auth token file ${file}: ${errorMessage(error)}`, {
      cause: error,
    });
  }
  if (token.length < 16 || /\s/.test(token)) {
    throw new ConfigError(`the auth token in ${file} must be at least 16 characters without whitespace`);
  }
  return token;
}

/**
 * Binds the API's address for a moment and lets it go: a taken port is found before anything
 * is restored (restoring first logged every finalized task ahead of the one line that matters).
 * Another process could take the port between this probe and the real listen; that rare race
 * still ends in the same one-line error, only later.
 */
export async function probeListen(host: string, port: number): Promise<void> {
  const server = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen({ host, port, exclusive: true }, resolve);
    });
  } catch (error) {
    throw listenError(error, host, port);
  }
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

/** The one line of a listen that failed on the configured address. */
export function listenError(error: unknown, host: string, port: number): StartupError {
  const code = (error as NodeJS.ErrnoException).code;
  return new StartupError(
    code === "EADDRINUSE"
      ? `port ${port} on ${host} is already in use (choose another with --shim-http-port)`
      : code === "EADDRNOTAVAIL"
        ? `cannot listen on ${host}:${port}: the address is not on this host (see --shim-http-address)`
        : `cannot listen on ${host}:${port}: ${errorMessage(error)}`,
    { cause: error },
  );
}

/** What step 1 found: the token the API asks for, and where it will listen. */
export interface Preconditions {
  readonly authToken: string | undefined;
  readonly target: ListenTarget;
}

/**
 * Step 1: the home created, the auth token read, the port probed (or the socket passed in
 * inspected), before the home lock, the engine and the restore. Throws when `interrupted`.
 */
export async function checkPreconditions(
  config: ShimConfig,
  interrupted: AbortSignal | undefined,
): Promise<Preconditions> {
  await mkdir(config.home, { recursive: true, mode: 0o755 });
  const authToken = await readAuthToken(config.authTokenFile);
  // A socket systemd or the supervisor passes in is already bound: only an address of our own is
  // probed. A socket-activation error is a configuration error (SocketActivationError, exit 78):
  // the unit would hit it again at every restart.
  const target = listenTarget({ host: config.httpAddress, port: config.httpPort }, process.env, process.pid);
  if (target.kind === "address") await probeListen(target.host, target.port);
  else {
    const inherited = await inspectInheritedSocket(target.fd);
    if (inherited.kind === "refused") throw new SocketActivationError(inherited.why);
  }
  interrupted?.throwIfAborted();
  return { authToken, target };
}

/** Step 2: the home's single-instance lock (`another taskshim is already running …`). */
export async function lockHome(home: string): Promise<HomeLock> {
  try {
    return await acquireHomeLock(home);
  } catch (error) {
    throw new StartupError(errorMessage(error), { cause: error });
  }
}

/**
 * Step 3: the log (stdout and `<home>/shim.log`), and the failpoints armed when asked for. A
 * failpoint spec that does not parse releases the lock and stops the start.
 */
export async function openLog(
  config: ShimConfig,
  lock: HomeLock,
): Promise<{ log: Logger; logFile: LogFileSink }> {
  // A log file made by an earlier version (0644) is narrowed too (never through a symlink).
  narrowLogFileMode(join(config.home, "shim.log"));
  const { log, logFile } = await createLogger(config);
  try {
    armFailpoints(config.testing.failpoints);
  } catch (error) {
    await lock.release();
    throw new StartupError(errorMessage(error), { cause: error });
  }
  if (config.testing.failpoints) log.warn({ failpoints: config.testing.failpoints }, "failpoints armed");
  return { log, logFile };
}
