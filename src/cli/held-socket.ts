import { spawn } from "node:child_process";
import { once } from "node:events";
import { createServer, type Server } from "node:net";
import { isSea } from "node:sea";
import { Command } from "@commander-js/extra-typings";
import { resolveShimConfig, SERVE_SETTINGS } from "../config/shim-config.js";
import { errorMessage } from "../errors/error-message.js";

/** Set by the outer `taskshim supervise` for the inner one: its fd 3 is the API's listening socket. */
export const HELD_SOCKET_ENV = "TASKSHIM_SUPERVISE_HELD_SOCKET";
/** The descriptor the inner supervisor holds and each shim is given (as systemd's first one). */
const HELD_FD = 3;

/** What `taskshim supervise` does about the API socket. */
export type SocketHolding =
  /** This is the inner supervisor: fd 3 is the socket; hand it to every shim (LISTEN_FDS=1). */
  | { readonly kind: "hold" }
  /** The outer supervisor ran the inner one, which has exited with this code. */
  | { readonly kind: "done"; readonly exitCode: number }
  /** No socket could be bound (say, the port is taken): supervise as before, each shim binds. */
  | { readonly kind: "none"; readonly why: string };

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
 * passes it to each `taskshim serve` it starts, with LISTEN_FDS=1 (src/cli/listen-target.ts).
 */
export async function holdApiSocket(
  serveArgs: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<SocketHolding> {
  if (env[HELD_SOCKET_ENV] === "1") {
    delete env[HELD_SOCKET_ENV];
    return { kind: "hold" };
  }
  let server: Server;
  try {
    const { host, port } = serveAddress(serveArgs, env);
    server = createServer();
    server.on("connection", (socket) => socket.destroy());
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen({ host, port, backlog: 1024 }, resolve);
    });
  } catch (error) {
    return { kind: "none", why: errorMessage(error) };
  }
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

/** The spawn settings of a shim started by a supervisor holding the socket. */
export function heldSocketSpawn(env: NodeJS.ProcessEnv): {
  stdio: readonly ["inherit", "inherit", "inherit", number];
  env: NodeJS.ProcessEnv;
} {
  const { LISTEN_PID: _pid, LISTEN_FDNAMES: _names, ...rest } = env;
  return { stdio: ["inherit", "inherit", "inherit", HELD_FD], env: { ...rest, LISTEN_FDS: "1" } };
}
