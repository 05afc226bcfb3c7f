import { selfInvocation } from "./self-invocation.js";
import { spawn, type ChildProcess } from "node:child_process";
import { constants } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { FileIdentity } from "../components/file-identity.js";
import { errorMessage } from "../errors/error-message.js";
import { ROLLBACK_ENV, type RollbackReport } from "../lifecycle/rollback-report.js";
import { HANDOFF_ENV, HandoffRelay } from "./connection-handoff.js";
import { formatDuration } from "../config/durations.js";
import { EXIT_CONFIG } from "../config/shim-config.js";
import { ARENA_ENV, MALLOC_ARENAS } from "./glibc-malloc.js";
import { heldSocketSpawn, watchParent } from "./held-socket.js";
import { PreviousBinary, type BinaryStanding } from "./previous-binary.js";
import { fitServeArgs, probeServeHelp } from "./serve-flags.js";
import { whenServing, type ServeAddress } from "./serving-watch.js";
import { UnservedGuard } from "./unserved-standin.js";

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
  /** fd 3 is the API's listening socket: hand it to every shim (src/shim/held-socket.ts). */
  readonly heldSocket?: boolean;
  /** Why the API socket is not held (the port could not be bound): said once, at the start. */
  readonly notHolding?: string;
  /**
   * This is the inner supervisor of a held socket: when the outer one is gone (killed), stop the
   * shim as SIGTERM would, so that no orphan keeps the port from the next supervisor.
   */
  readonly watchOuter?: boolean;
  /**
   * A binary other than the one kept as `<binary>.previous` (a new install) that has not served
   * within this many ms, or exits before it serves, is replaced by the kept one (default 60 s).
   */
  readonly serveWithinMs?: number;
  /** Where `serve` listens: a shim that does not say it serves (an older release) is asked there. */
  readonly address?: ServeAddress;
  /**
   * With a held socket: once no shim has served for this many ms, `standIn` answers the socket's
   * connections with a 503 until one does (default 10 s).
   */
  readonly refuseAfterMs?: number;
  /** Starts the process that answers 503 on the held socket (src/shim/unserved-standin.ts). */
  readonly standIn?: () => ChildProcess;
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

/** The default bound within which a new binary must serve (its restore included). */
export const SERVE_WITHIN_MS = 60_000;
/** The default time without a serving shim after which the held socket answers 503. */
export const REFUSE_AFTER_MS = 10_000;
/** How long a new binary that has not served is given to stop on SIGTERM before SIGKILL. */
const TRIAL_STOP_MS = 20_000;

/** How one run of a shim went, as far as the rollback cares. */
type RunEnd =
  | { readonly kind: "exited"; readonly exit: ChildExit; readonly served: boolean }
  /** A binary on trial that did not serve within the bound; it was stopped. */
  | { readonly kind: "unserved"; readonly exit: ChildExit };

/**
 * Keeps `<binary> serve …` running, for hosts without systemd: exit 0 (a shutdown for an
 * upgrade) restarts at once with whatever binary is now installed; a crash restarts after an
 * exponential backoff (reset after a stable run); exit 78 (a configuration error) ends the
 * supervisor with 78, since the same configuration would fail again. SIGTERM/SIGINT go to the
 * shim, and the supervisor exits when it does. Containers are never the supervisor's business:
 * they belong to dockerd.
 *
 * The last binary that served is kept as `<binary>.previous`; a new one that exits before it
 * serves (78 included) or does not serve within `serveWithinMs` is replaced by it and restarted.
 * Each binary is given only the serve flags its `serve --help` lists, so an older release rolled
 * back to is not refused for a flag it does not know.
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
  const guard =
    options.heldSocket && options.standIn
      ? new UnservedGuard(options.refuseAfterMs ?? REFUSE_AFTER_MS, options.standIn, note)
      : undefined;
  const stop = (signal: NodeJS.Signals): void => {
    stopping = true;
    stopped.abort();
    relay.close();
    guard?.close();
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
  const previous = new PreviousBinary(options.binary);
  const fitted = new ServeArgsCache(options.binary, options.serveArgs, env, note);
  let rollback: RollbackReport | undefined;
  guard?.unserved();
  try {
    let crashes = 0;
    for (let run = 1; !stopping; run++) {
      const standing = await previous
        .standing()
        .catch((): BinaryStanding => ({ kind: "proven", identity: undefined }));
      const serveArgs = await fitted.argsFor(standing.identity);
      if (stopping) break;
      const started = performance.now();
      // Never through PATH: a bundle's shebang would run whatever `node` comes first there.
      const self = selfInvocation(options.binary);
      child = spawn(self.file, [...self.args, "serve", ...serveArgs], {
        stdio: [...stdio, "ipc"],
        // The arena cap of the bundle's shebang, for the single binary too (an operator's own wins).
        env: {
          [ARENA_ENV]: String(MALLOC_ARENAS),
          ...env,
          [HANDOFF_ENV]: "1",
          // The binary put back is told (its healthcheck says so); a new binary on trial is not.
          ...(rollback && standing.kind === "proven" ? { [ROLLBACK_ENV]: JSON.stringify(rollback) } : {}),
        },
      });
      relay.attach(child);
      note("shim started", {
        run,
        pid: child.pid,
        binary: options.binary,
        ...(standing.kind === "trial" ? { trial: true } : {}),
      });
      const end = await runShim(child, {
        trialMs: standing.kind === "trial" ? (options.serveWithinMs ?? SERVE_WITHIN_MS) : undefined,
        address: options.address,
        onError: (error) => note("shim could not start", { error: error.message }),
        onServing: async () => {
          guard?.serving();
          if (standing.kind === "trial") {
            rollback = undefined;
            note("new binary serves", { binary: options.binary });
          }
          await previous.keep(standing.identity).then(
            (kept) => {
              if (kept === "kept") note("kept the binary that serves to go back to", { path: previous.path });
            },
            (error: unknown) =>
              note("cannot keep the binary that serves to go back to", { error: errorMessage(error) }),
          );
        },
      });
      guard?.unserved();
      const exit = end.exit;
      const ranMs = Math.round(performance.now() - started);
      const how = { code: exit.code, ...(exit.signal ? { signal: exit.signal } : {}), ranMs };
      if (stopping) {
        note("supervisor stopping", how);
        return 0;
      }
      if (standing.kind === "trial" && (end.kind === "unserved" || !end.served)) {
        const reason =
          end.kind === "unserved"
            ? `did not serve within ${formatDuration(options.serveWithinMs ?? SERVE_WITHIN_MS)}`
            : `${exit.signal ? `was killed by ${exit.signal}` : `exited ${exit.code}`} before serving (ran ${formatDuration(ranMs)})`;
        const restored = await previous.restore().then(
          (done) => (done ? undefined : "nothing kept"),
          (error: unknown) => errorMessage(error),
        );
        if (restored === undefined) {
          rollback = { at: new Date().toISOString(), reason, binary: options.binary };
          note("the new binary failed; rolled back to the previous one", {
            ...how,
            reason,
            previous: previous.path,
          });
          crashes = 0;
          await sleep(options.handoffDelayMs, undefined, { signal: stopped.signal }).catch(() => undefined);
          continue;
        }
        note("the new binary failed and the previous one cannot be put back", {
          ...how,
          reason,
          why: restored,
        });
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
    guard?.close();
    options.stop?.removeEventListener("abort", onStop);
    relay.close();
    process.off("SIGTERM", onTerm);
    process.off("SIGINT", onInt);
  }
}

/**
 * Waits for a shim's exit, calling `onServing` once it serves. A binary on trial (`trialMs`) that
 * has not served by then is stopped (SIGTERM, then SIGKILL): it is replaced, not waited for.
 */
async function runShim(
  child: ChildProcess,
  watch: {
    readonly trialMs: number | undefined;
    readonly address: ServeAddress | undefined;
    readonly onServing: () => Promise<void>;
    /** It could not be started at all (a missing binary, no exec permission). */
    readonly onError: (error: Error) => void;
  },
): Promise<RunEnd> {
  const exited = new Promise<ChildExit>((resolve) => {
    child.once("error", (error) => {
      watch.onError(error);
      resolve({ code: 127 });
    });
    child.once("exit", (code, signal) => resolve(childExit(code, signal)));
  });
  const watching = new AbortController();
  let served = false;
  const serving = whenServing(child, watch.address, watching.signal).then(async () => {
    served = true;
    await watch.onServing();
  });
  try {
    if (watch.trialMs !== undefined) {
      const first = await Promise.race([
        exited.then(() => "exited" as const),
        serving.then(() => "served" as const),
        sleep(watch.trialMs, "late" as const, { signal: watching.signal }).catch(() => "exited" as const),
      ]);
      if (first === "late" && !served) {
        child.kill("SIGTERM");
        const killed = setTimeout(() => child.kill("SIGKILL"), TRIAL_STOP_MS);
        const exit = await exited;
        clearTimeout(killed);
        return { kind: "unserved", exit };
      }
    }
    const exit = await exited;
    // A shim that served and exited at once: its keeping is done before the next start.
    if (served) await serving;
    return { kind: "exited", exit, served };
  } finally {
    watching.abort();
  }
}

/** Each binary's serve arguments, fitted to its `serve --help` once per file. */
class ServeArgsCache {
  #for: FileIdentity | undefined;
  #args: readonly string[];

  constructor(
    private readonly binary: string,
    private readonly given: readonly string[],
    private readonly env: NodeJS.ProcessEnv,
    private readonly note: (message: string, fields?: Record<string, unknown>) => void,
  ) {
    this.#args = given;
  }

  async argsFor(identity: FileIdentity | undefined): Promise<readonly string[]> {
    if (identity === undefined) return this.given;
    const same = this.#for !== undefined && this.#for.ino === identity.ino && this.#for.dev === identity.dev;
    if (same && this.#for?.ctimeNs === identity.ctimeNs) return this.#args;
    this.#for = identity;
    const { LISTEN_FDS: _fds, ...env } = this.env;
    try {
      const fit = fitServeArgs(this.given, await probeServeHelp(this.binary, env), this.env);
      if (fit.dropped.length > 0 || fit.ignoredVariables.length > 0) {
        this.note("this binary does not know some serve flags; not passing them", {
          dropped: fit.dropped,
          ...(fit.ignoredVariables.length > 0 ? { ignoredVariables: fit.ignoredVariables } : {}),
        });
      }
      this.#args = fit.args;
    } catch {
      // Not a taskshim that answers `serve --help` (a fake, a dstack-shim): the flags as given.
      this.#args = this.given;
    }
    return this.#args;
  }
}
