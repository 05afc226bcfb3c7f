import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createServer, type Server } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { isSea } from "node:sea";
import { Command } from "@commander-js/extra-typings";
import { resolveShimConfig, SERVE_SETTINGS } from "../config/shim-config.js";
import { errorMessage } from "../errors/error-message.js";
import { formatDuration } from "../config/durations.js";
import { STANDIN_ENV } from "./unserved-standin.js";

/** Set by the outer `taskshim supervise` for the inner one: its fd 3 is the API's listening socket. */
export const HELD_SOCKET_ENV = "TASKSHIM_SUPERVISE_HELD_SOCKET";
/** The descriptor the inner supervisor holds and each shim is given (as systemd's first one). */
const HELD_FD = 3;

/**
 * How long a new supervisor waits for the API's port to be free when it is taken: an earlier
 * supervisor's shim may still be shutting down (orphaned when that supervisor was killed, it shuts
 * down by itself: {@link watchParent}, and commands.ts's `serve`), which takes the shutdown's bound
 * (20 s) at most; beyond that, something else holds the port.
 */
export const PORT_WAIT_MS = 30_000;
/** The first pause between two binds while waiting for the port, doubled up to the last. */
const PORT_RETRY_FIRST_MS = 100;
const PORT_RETRY_MAX_MS = 2_000;

/** Options of {@link holdApiSocket}. */
export interface HoldOptions {
  /** Ends a wait for the port at once (SIGTERM/SIGINT to the supervisor). */
  readonly signal?: AbortSignal;
  /** How long to wait for a port in use to be free (default {@link PORT_WAIT_MS}). */
  readonly portWaitMs?: number;
  /** Told once when the port is in use and the supervisor starts waiting for it. */
  readonly onWait?: (why: string, waitMs: number) => void;
}

/** What `taskshim supervise` does about the API socket. */
export type SocketHolding =
  /** This is the inner supervisor: fd 3 is the socket; hand it to every shim (LISTEN_FDS=1). */
  | { readonly kind: "hold" }
  /** The outer supervisor ran the inner one, which has exited with this code. */
  | { readonly kind: "done"; readonly exitCode: number }
  /** No socket could be bound (say, the port is taken): supervise as before, each shim binds. */
  | { readonly kind: "none"; readonly why: string }
  /** A SIGTERM/SIGINT ended the wait for the port: nothing was started. */
  | { readonly kind: "stopped" };

/** The address and port `serve` would listen on with these arguments and this environment. */
export function serveAddress(
  serveArgs: readonly string[],
  env: NodeJS.ProcessEnv,
): { host: string; port: number } {
  const parser = new Command().exitOverride().allowUnknownOption().allowExcessArguments();
  for (const setting of Object.values(SERVE_SETTINGS)) parser.option(setting.flag);
  parser.parse([...serveArgs], { from: "user" });
  const config = resolveShimConfig(parser.opts(), env);
  return { host: config.httpAddress, port: config.httpPort };
}

/**
 * Makes `taskshim supervise` hold the API's listening socket across shim restarts, as systemd's
 * socket activation does: a request made while no shim runs (an upgrade handoff, a crash) waits
 * in the socket's backlog instead of being refused.
 *
 * Node accepts on every socket it listens on, so the process that binds cannot be the one that
 * holds: this (outer) process binds `serve`'s address, runs the same command again as the inner
 * supervisor with the socket as fd 3, closes its own copy, forwards SIGTERM/SIGINT and ends with
 * the inner one's exit code. The inner supervisor never touches fd 3 (nothing in it accepts) and
 * passes it to each `taskshim serve` it starts, with LISTEN_FDS=1 (src/shim/listen-target.ts).
 */
export async function holdApiSocket(
  serveArgs: readonly string[],
  env: NodeJS.ProcessEnv,
  options: HoldOptions = {},
): Promise<SocketHolding> {
  if (env[HELD_SOCKET_ENV] === "1") {
    delete env[HELD_SOCKET_ENV];
    return { kind: "hold" };
  }
  let address: { host: string; port: number };
  try {
    address = serveAddress(serveArgs, env);
  } catch (error) {
    return { kind: "none", why: errorMessage(error) };
  }
  const bound = await bindWaiting(address, options);
  if (bound.kind !== "bound") return bound;
  const server = bound.server;
  const handle = (server as unknown as { _handle?: { fd?: number } })._handle;
  if (typeof handle?.fd !== "number" || handle.fd < 0) {
    server.close();
    return { kind: "none", why: "the listening socket has no descriptor" };
  }
  const args = isSea() ? process.argv.slice(2) : [...process.execArgv, ...process.argv.slice(1)];
  const inner = spawn(process.execPath, args, {
    stdio: ["inherit", "inherit", "inherit", handle.fd],
    env: { ...env, [HELD_SOCKET_ENV]: "1" },
  });
  server.close();
  const forward = (signal: NodeJS.Signals): void => void inner.kill(signal);
  process.on("SIGTERM", forward);
  process.on("SIGINT", forward);
  const [code, signal] = (await once(inner, "exit")) as [number | null, NodeJS.Signals | null];
  return { kind: "done", exitCode: code ?? (signal ? 128 : 1) };
}

/**
 * Binds the API's address; a port in use is tried again with a growing pause (an earlier shim may
 * still be shutting down) until `portWaitMs`, then given up with the reason.
 */
export async function bindWaiting(
  { host, port }: { host: string; port: number },
  options: HoldOptions,
): Promise<{ kind: "bound"; server: Server } | { kind: "none"; why: string } | { kind: "stopped" }> {
  const waitMs = options.portWaitMs ?? PORT_WAIT_MS;
  const began = performance.now();
  let pauseMs = PORT_RETRY_FIRST_MS;
  for (let attempt = 1; ; attempt++) {
    if (options.signal?.aborted) return { kind: "stopped" };
    const server = createServer();
    server.on("connection", (socket) => socket.destroy());
    try {
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen({ host, port, backlog: 1024, exclusive: true }, resolve);
      });
      return { kind: "bound", server };
    } catch (error) {
      const inUse = (error as NodeJS.ErrnoException).code === "EADDRINUSE";
      const why = inUse ? `port ${port} on ${host} is in use` : errorMessage(error);
      const leftMs = waitMs - (performance.now() - began);
      if (!inUse || leftMs <= 0) {
        return { kind: "none", why: inUse ? `${why} (waited ${formatDuration(waitMs)} for it)` : why };
      }
      if (attempt === 1) options.onWait?.(why, waitMs);
      const aborted = await sleep(Math.min(pauseMs, leftMs), undefined, { signal: options.signal }).then(
        () => false,
        () => true,
      );
      if (aborted) return { kind: "stopped" };
      pauseMs = Math.min(PORT_RETRY_MAX_MS, pauseMs * 2);
    }
  }
}

/**
 * For the inner supervisor: calls `onGone` once when the outer one has gone (killed: this process
 * was re-parented), checked every `everyMs`. The inner supervisor then stops its shim as a
 * SIGTERM would, so no orphan keeps the port from the next supervisor.
 */
export function watchParent(onGone: () => void, everyMs = 1_000): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    onGone();
  }, everyMs);
  timer.unref();
  return () => clearInterval(timer);
}

/**
 * Starts this command again as the stand-in that answers 503 on the held socket
 * (src/shim/unserved-standin.ts), with the socket as its fd 3. The single binary is run from
 * `/proc/self/exe`, this very file: the stand-in is needed exactly when the file at the
 * supervisor's path may have been replaced by a binary that does not serve.
 */
export function standInSpawn(): ChildProcess {
  const sea = isSea();
  const args = sea ? process.argv.slice(2) : [...process.execArgv, ...process.argv.slice(1)];
  return spawn(sea ? "/proc/self/exe" : process.execPath, args, {
    stdio: ["ignore", "inherit", "inherit", HELD_FD],
    env: { ...process.env, [STANDIN_ENV]: "1" },
  });
}

/** The spawn settings of a shim started by a supervisor holding the socket. */
export function heldSocketSpawn(env: NodeJS.ProcessEnv): {
  stdio: readonly ["inherit", "inherit", "inherit", number];
  env: NodeJS.ProcessEnv;
} {
  const { LISTEN_PID: _pid, LISTEN_FDNAMES: _names, ...rest } = env;
  return { stdio: ["inherit", "inherit", "inherit", HELD_FD], env: { ...rest, LISTEN_FDS: "1" } };
}
