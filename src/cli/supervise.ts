import { spawn, type ChildProcess } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { heldSocketSpawn } from "./held-socket.js";

/** Options of `taskshim supervise`. */
export interface SuperviseOptions {
  /** The shim binary to (re)start: the install target, so a new binary is picked up. */
  readonly binary: string;
  /** Arguments after `serve`. */
  readonly serveArgs: readonly string[];
  /** Delay before restarting after a non-zero exit (a crash), in ms. */
  readonly crashDelayMs: number;
  /** Delay before restarting after exit 0 (an upgrade handoff), in ms. */
  readonly handoffDelayMs: number;
  /** fd 3 is the API's listening socket: hand it to every shim (src/cli/held-socket.ts). */
  readonly heldSocket?: boolean;
}

function note(message: string, fields: Record<string, unknown> = {}): void {
  process.stderr.write(
    `${JSON.stringify({ time: Date.now(), supervisor: true, msg: message, ...fields })}\n`,
  );
}

/**
 * Keeps `<binary> serve …` running, for hosts without systemd: exit 0 (a shutdown for an
 * upgrade) restarts at once with whatever binary is now installed, a crash restarts after a
 * delay. SIGTERM/SIGINT go to the shim, and the supervisor exits when it does. Containers are
 * never the supervisor's business: they belong to dockerd.
 */
export async function supervise(options: SuperviseOptions): Promise<number> {
  let stopping = false;
  let child: ChildProcess | undefined;
  const stop = (signal: NodeJS.Signals): void => {
    stopping = true;
    child?.kill(signal);
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));

  for (let run = 1; ; run++) {
    const started = Date.now();
    child = spawn(
      options.binary,
      ["serve", ...options.serveArgs],
      options.heldSocket ? heldSocketSpawn(process.env) : { stdio: "inherit" },
    );
    note("shim started", { run, pid: child.pid, binary: options.binary });
    const code = await new Promise<number>((resolve) => {
      child?.once("error", (error) => {
        note("shim could not start", { error: error.message });
        resolve(127);
      });
      child?.once("exit", (exitCode, signal) => resolve(exitCode ?? (signal ? 128 : 1)));
    });
    if (stopping) {
      note("supervisor stopping", { code });
      return 0;
    }
    const delay = code === 0 ? options.handoffDelayMs : options.crashDelayMs;
    note("shim exited; restarting", { code, ranMs: Date.now() - started, delayMs: delay });
    await sleep(delay);
    if (stopping) return 0;
  }
}
