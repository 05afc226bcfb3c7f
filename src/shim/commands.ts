/*
 * What `taskshim serve` (and the bare `taskshim`) and `taskshim supervise` run, once commander
 * has parsed their flags (cli/main.ts). This module is loaded by every command, client ones
 * included, so it stays light: the server's dependencies (fastify, dockerode, pino, prom-client)
 * are imported only when a shim really starts.
 */
import { resolve } from "node:path";
import { isSea } from "node:sea";
import { resolveShimConfig, type ServeFlags } from "../config/shim-config.js";
import { loadGlibcMalloc, MALLOC_ARENAS } from "./glibc-malloc.js";
import { holdApiSocket, serveAddress, standInSpawn } from "./held-socket.js";
import type { RunningShim } from "./start-shim.js";
import { StartInterruptedError } from "./start-interruption.js";
import { supervise } from "./supervise.js";
import { serveUnavailable, STANDIN_ENV } from "./unserved-standin.js";

/**
 * The path of this shim's own executable: the single binary, or the bundle node runs, whatever
 * its name (dstack installs it as `/usr/local/bin/dstack-shim`).
 */
export function ownBinaryPath(): string {
  const script = process.argv[1];
  return isSea() || !script ? process.execPath : resolve(script);
}

/** Serves until a shutdown, then exits the process (0, or the start's error thrown). */
export async function serve(flags: ServeFlags): Promise<void> {
  // The signal handlers before anything else: a SIGTERM while the shim still starts (a restore
  // held by a slow engine or disk) is a clean stop (home lock released, exit 0), never Node's
  // default handler's kill. Once it serves, a signal is the same bounded shutdown as
  // POST /api/shutdown; a second one skips the grace.
  const start = new AbortController();
  let shim: RunningShim | undefined;
  const onSignal = (signal?: unknown): void => {
    if (shim !== undefined) shim.shutdown(false);
    else if (!start.signal.aborted) {
      start.abort(new StartInterruptedError(typeof signal === "string" ? signal : "disconnect"));
    }
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  // Under `taskshim supervise` (an IPC channel to it): a supervisor that is gone (killed) leaves
  // this shim an orphan on the API's port, which the next supervisor could never bind. It shuts
  // down as on SIGTERM instead; the next supervisor waits for the port (held-socket.ts).
  if (process.channel !== undefined) process.once("disconnect", onSignal);
  // The arena limit only holds for threads that have not allocated yet.
  const malloc = loadGlibcMalloc();
  malloc?.limitArenas(MALLOC_ARENAS);
  const config = resolveShimConfig(flags, process.env, { shimBinaryPath: ownBinaryPath() });
  // Loaded on demand: the server's dependencies (fastify, dockerode, pino, prom-client) would
  // otherwise slow every client command down.
  const { startShim } = await import("./start-shim.js");
  try {
    shim = await startShim(config, malloc, start.signal);
  } catch (error) {
    // Stopped by a signal before it served: logged by the start, the home lock released.
    if (error instanceof StartInterruptedError) process.exit(0);
    throw error;
  }
  // A signal in the moment between the last check of the start and its return.
  if (start.signal.aborted) shim.shutdown(false);
  await shim.stopped;
  // Ends what the bound left behind too (a read stuck in the kernel, a step that ignored its signal).
  process.exit(0);
}

/** `taskshim supervise`'s flags, in ms, as commander parses them. */
export interface SupervisorFlags {
  readonly binary?: string;
  readonly crashDelay: number;
  readonly maxCrashDelay: number;
  readonly stableAfter: number;
  readonly handoffDelay: number;
  readonly serveWithin: number;
  readonly refuseAfter: number;
}

/** Where the supervised shims serve, when the serve flags say (else the healthcheck is not asked). */
function address(serveArgs: readonly string[]): { address?: { host: string; port: number } } {
  try {
    return { address: serveAddress(serveArgs, process.env) };
  } catch {
    return {};
  }
}

/** Supervises `serve` with `serveArgs` until stopped, then exits the process with its status. */
export async function runSupervisor(serveArgs: readonly string[], options: SupervisorFlags): Promise<void> {
  // The inner supervisor's stand-in: answer 503 on the held socket until told to stop.
  if (process.env[STANDIN_ENV] === "1") {
    await serveUnavailable(3);
    process.exit(0);
  }
  // A SIGTERM while waiting for the port (an earlier shim still shutting down) ends at once.
  const waiting = new AbortController();
  const stopWaiting = (): void => waiting.abort();
  process.once("SIGTERM", stopWaiting);
  process.once("SIGINT", stopWaiting);
  const holding = await holdApiSocket(serveArgs, process.env, {
    signal: waiting.signal,
    onWait: (why, waitMs) =>
      process.stderr.write(
        `${JSON.stringify({ time: new Date().toISOString(), supervisor: true, msg: "the API's port is in use; waiting for it (an earlier shim may still be shutting down)", why, waitMs })}\n`,
      ),
  });
  process.off("SIGTERM", stopWaiting);
  process.off("SIGINT", stopWaiting);
  if (holding.kind === "stopped") process.exit(0);
  if (holding.kind === "done") process.exit(holding.exitCode);
  const code = await supervise({
    binary: options.binary ?? ownBinaryPath(),
    serveArgs,
    crashDelayMs: options.crashDelay,
    maxCrashDelayMs: Math.max(options.maxCrashDelay, options.crashDelay),
    stableAfterMs: options.stableAfter,
    handoffDelayMs: options.handoffDelay,
    serveWithinMs: options.serveWithin,
    refuseAfterMs: options.refuseAfter,
    ...address(serveArgs),
    standIn: standInSpawn,
    heldSocket: holding.kind === "hold",
    watchOuter: holding.kind === "hold",
    ...(holding.kind === "none" ? { notHolding: holding.why } : {}),
  });
  process.exit(code);
}
