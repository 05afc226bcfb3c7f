import { spawn, type ChildProcess } from "node:child_process";
import { constants } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { HANDOFF_ENV, HandoffRelay } from "./connection-handoff.js";
import { ARENA_ENV, MALLOC_ARENAS } from "./glibc-malloc.js";
import { heldSocketSpawn, watchParent } from "./held-socket.js";

/** sysexits' EX_CONFIG, which `serve` exits with on a configuration error: restarting cannot help. */
export const EXIT_CONFIG = 78;

/** Options of `taskshim supervise`. */
export interface SuperviseOptions {
  /** The shim binary to (re)start: the install target, so a new binary is picked up. */
  readonly binary: string;
  /** Arguments after `serve`. */
  readonly serveArgs: readonly string[];
  /** Delay before the first restart after a crash (a non-zero exit), in ms; doubled per crash. */
  readonly crashDelayMs: number;
  /** The longest delay between crash restarts, in ms. */
  readonly maxCrashDelayMs: number;
  /** A run at least this long (ms) counts as stable: the next crash starts from crashDelayMs again. */
  readonly stableAfterMs: number;
  /** Delay before restarting after exit 0 (an upgrade handoff), in ms. */
  readonly handoffDelayMs: number;
  /** fd 3 is the API's listening socket: hand it to every shim (src/cli/held-socket.ts). */
  readonly heldSocket?: boolean;
  /** Why the API socket is not held (the port could not be bound): said once, at the start. */
  readonly notHolding?: string;
  /**
   * This is the inner supervisor of a held socket: when the outer one is gone (killed), stop the
   * shim as SIGTERM would, so that no orphan keeps the port from the next supervisor.
   */
  readonly watchOuter?: boolean;
  /** Aborting it stops the supervisor as SIGTERM does (tests; the signals are wired by default). */
  readonly stop?: AbortSignal;
  /** Where the supervisor's own lines go (JSON, one a line); stderr by default. */
  readonly log?: (line: string) => void;
}

/** How a child ended: its code, or the signal that killed it and the shell's 128+N for it. */
export interface ChildExit {
  readonly code: number;
  readonly signal?: NodeJS.Signals;
}

/** `exit` event values → one exit: a signal becomes 128 + its number, as a shell reports it. */
export function childExit(code: number | null, signal: NodeJS.Signals | null): ChildExit {
  if (code !== null) return { code };
  if (signal !== null) return { code: 128 + (constants.signals[signal] ?? 0), signal };
  return { code: 1 };
}

/** The delay before restart number `crashes` in a row (1 = the first crash): doubled, capped. */
export function crashDelay(
  crashes: number,
  options: Pick<SuperviseOptions, "crashDelayMs" | "maxCrashDelayMs">,
): number {
  const doubled = options.crashDelayMs * 2 ** Math.max(0, crashes - 1);
  return Math.min(options.maxCrashDelayMs, doubled);
}

/**
 * Keeps `<binary> serve …` running, for hosts without systemd: exit 0 (a shutdown for an
 * upgrade) restarts at once with whatever binary is now installed; a crash restarts after an
 * exponential backoff (reset after a stable run); exit 78 (a configuration error) ends the
 * supervisor with 78, since the same configuration would fail again. SIGTERM/SIGINT go to the
 * shim, and the supervisor exits when it does. Containers are never the supervisor's business:
 * they belong to dockerd.
 */
export async function supervise(options: SuperviseOptions): Promise<number> {
  const write = options.log ?? ((line: string) => process.stderr.write(line));
  const note = (message: string, fields: Record<string, unknown> = {}): void =>
    write(
      `${JSON.stringify({ time: new Date().toISOString(), supervisor: true, msg: message, ...fields })}\n`,
    );
  // Kept-alive API connections go from each shim that drains to the next one that serves.
  const relay = new HandoffRelay();
  let stopping = false;
  let child: ChildProcess | undefined;
  // Ends a backoff's sleep at once: a stop never waits out the delay before a restart.
  const stopped = new AbortController();
  const stop = (signal: NodeJS.Signals): void => {
    stopping = true;
    stopped.abort();
    relay.close();
    if (child?.exitCode === null && child.signalCode === null) child.kill(signal);
  };
  const onTerm = (): void => stop("SIGTERM");
  const onInt = (): void => stop("SIGINT");
  process.on("SIGTERM", onTerm);
  process.on("SIGINT", onInt);
  const onStop = (): void => stop("SIGTERM");
  if (options.stop?.aborted) onStop();
  else options.stop?.addEventListener("abort", onStop, { once: true });
  if (options.notHolding !== undefined) {
    note("not holding the API socket; each shim binds the port itself", { why: options.notHolding });
  }
  const unwatch = options.watchOuter
    ? watchParent(() => {
        note("the outer supervisor is gone; stopping the shim");
        stop("SIGTERM");
      })
    : () => undefined;
  const { stdio, env }: { stdio: readonly ("inherit" | number)[]; env: NodeJS.ProcessEnv } =
    options.heldSocket
      ? heldSocketSpawn(process.env)
      : { stdio: ["inherit", "inherit", "inherit"], env: process.env };
  try {
    let crashes = 0;
    for (let run = 1; !stopping; run++) {
      const started = Date.now();
      child = spawn(options.binary, ["serve", ...options.serveArgs], {
        stdio: [...stdio, "ipc"],
        // The arena cap of the bundle's shebang, for the single binary too (an operator's own wins).
        env: { [ARENA_ENV]: String(MALLOC_ARENAS), ...env, [HANDOFF_ENV]: "1" },
      });
      relay.attach(child);
      note("shim started", { run, pid: child.pid, binary: options.binary });
      const exit = await new Promise<ChildExit>((resolve) => {
        child?.once("error", (error) => {
          note("shim could not start", { error: error.message });
          resolve({ code: 127 });
        });
        child?.once("exit", (code, signal) => resolve(childExit(code, signal)));
      });
      const ranMs = Date.now() - started;
      const how = { code: exit.code, ...(exit.signal ? { signal: exit.signal } : {}), ranMs };
      if (stopping) {
        note("supervisor stopping", how);
        return 0;
      }
      if (exit.code === EXIT_CONFIG) {
        note("shim refused its configuration; not restarting (fix it, then start again)", how);
        return EXIT_CONFIG;
      }
      let delay: number;
      if (exit.code === 0) {
        crashes = 0;
        delay = options.handoffDelayMs;
      } else {
        crashes = ranMs >= options.stableAfterMs ? 1 : crashes + 1;
        delay = crashDelay(crashes, options);
      }
      note(exit.code === 0 ? "shim exited; restarting" : "shim crashed; restarting", {
        ...how,
        ...(exit.code === 0 ? {} : { crashes }),
        delayMs: delay,
      });
      await sleep(delay, undefined, { signal: stopped.signal }).catch(() => undefined);
      if (stopping) {
        note("supervisor stopping");
        return 0;
      }
    }
    return 0;
  } finally {
    unwatch();
    options.stop?.removeEventListener("abort", onStop);
    relay.close();
    process.off("SIGTERM", onTerm);
    process.off("SIGINT", onInt);
  }
}
