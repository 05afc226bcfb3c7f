import { spawn, type ChildProcess, type SpawnOptions, type StdioOptions } from "node:child_process";
import { after, ChildWatch } from "./child-watch.js";
import {
  killAndReap,
  type CleanupEvidence,
  type CleanupGraces,
  type CleanupTrigger,
  type KillResult,
} from "./cleanup-evidence.js";
import { OperationBound } from "./operation-bound.js";
import { errorMessage } from "../errors/error-message.js";

/** Grace for the killed process group's leader to be reaped. */
export const COMMAND_REAP_GRACE_MS = 5_000;
/** Grace for stdin, stdout and stderr to finish once the process group is killed. */
export const COMMAND_IO_DRAIN_GRACE_MS = 5_000;
/** Output kept per stream; the rest is drained and dropped so a chatty child cannot exhaust memory. */
export const COMMAND_OUTPUT_CAP_BYTES = 8 * 1024 * 1024;

/** One external command invocation. */
export interface CommandRequest {
  readonly argv: readonly string[];
  readonly cwd?: string;
  /** Written to the child's stdin without blocking the wait; stdin is closed afterwards. */
  readonly stdin?: string | Buffer;
  /**
   * The deadline of the whole operation; defaults to unbounded. It covers everything: the wait
   * for the child, and the wait for its pipes to end (a grandchild may hold them open).
   */
  readonly bound?: OperationBound;
  /** A cap for this one attempt, never past the operation's deadline. */
  readonly attemptCapMs?: number;
  /** Whether an operator interruption (SIGINT/SIGTERM to the shim) kills this command. Default true. */
  readonly interruptible?: boolean;
}

/** A bounded invocation that reached an observable end. */
export type BoundedOutcome =
  | {
      readonly kind: "exited";
      /** Exit code, or null when the child died by a signal. */
      readonly code: number | null;
      readonly signal: NodeJS.Signals | null;
      readonly stdout: Buffer;
      readonly stderr: Buffer;
    }
  | {
      readonly kind: "expired";
      readonly kill: KillResult;
      /** The operation's elapsed time when the bound fired, before the cleanup. */
      readonly operationElapsedMs: number;
      /** null when the bound had already expired and nothing was spawned. */
      readonly cleanup: CleanupEvidence | null;
    }
  | {
      readonly kind: "interrupted";
      readonly kill: KillResult;
      /** The operation's elapsed time when the interruption was seen, before the cleanup. */
      readonly operationElapsedMs: number;
      readonly cleanup: CleanupEvidence;
    };

/** The command could not be started (empty argv, missing binary, bad cwd…). */
export class CommandLaunchError extends Error {
  override readonly name = "CommandLaunchError";
}
/** Writing the stdin payload failed (EPIPE included: the child did not read all of it). */
export class CommandStdinError extends Error {
  override readonly name = "CommandStdinError";
}
/** The child exited, but reading its output failed, so the captured output is not whole. */
export class CommandWaitError extends Error {
  override readonly name = "CommandWaitError";
}
/** Waiting for the child failed; the process group was killed, and this is what the cleanup saw. */
export class CommandWaitCleanupError extends Error {
  override readonly name = "CommandWaitCleanupError";
  constructor(
    message: string,
    readonly operationElapsedMs: number,
    readonly cleanup: CleanupEvidence,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** The port every external command goes through. */
export interface CommandRunner {
  run(request: CommandRequest): Promise<BoundedOutcome>;
}

/** How a `BoundedCommandRunner` starts a child: `child_process.spawn`, or a test's wrapper around it. */
export type SpawnFn = (
  program: string,
  args: readonly string[],
  options: SpawnOptions & { readonly stdio: StdioOptions },
) => ChildProcess;

/** Tuning of a {@link BoundedCommandRunner}; the defaults are the seed's graces. */
export interface BoundedRunnerOptions {
  /** Grace for the killed group's leader to be reaped (default {@link COMMAND_REAP_GRACE_MS}). */
  readonly reapMs?: number;
  /** Grace for the pipes to finish once the group is killed (default {@link COMMAND_IO_DRAIN_GRACE_MS}). */
  readonly drainMs?: number;
  /** Starts the child (default `child_process.spawn`). */
  readonly spawn?: SpawnFn;
}

/** What ended a wait: the awaited event, the bound, or an interruption. */
type Ending<T> =
  | { readonly type: "done"; readonly value: T }
  | { readonly type: "deadline" }
  | { readonly type: "interruption" }
  | { readonly type: "wait-failure"; readonly error: Error };

/**
 * Runs external commands in their own process group and drains both pipes from the start (a child
 * that fills a pipe would otherwise block forever). One bound covers the whole operation: the wait
 * for the child and the wait for its pipes to end, which a grandchild in the group may hold open
 * after the child exited. When the bound fires or the operator interrupts, the whole group is
 * SIGKILLed, its leader reaped and its pipes drained, each within a grace, and the outcome carries
 * typed evidence of what the cleanup saw.
 *
 * Hand-written because neither `child_process.execFile` nor execa kills a process group,
 * verifies the reap, or reports what the cleanup saw.
 */
export class BoundedCommandRunner implements CommandRunner {
  private readonly graces: CleanupGraces;
  private readonly spawn: SpawnFn;

  constructor(
    /** Aborted when the operator interrupts the shim (SIGINT/SIGTERM). */
    private readonly interruption?: AbortSignal,
    options: BoundedRunnerOptions = {},
  ) {
    this.graces = {
      reapMs: options.reapMs ?? COMMAND_REAP_GRACE_MS,
      drainMs: options.drainMs ?? COMMAND_IO_DRAIN_GRACE_MS,
    };
    this.spawn = options.spawn ?? ((program, args, opts) => spawn(program, args, opts));
  }

  async run(request: CommandRequest): Promise<BoundedOutcome> {
    const bound = request.bound ?? OperationBound.unbounded();
    const remaining = bound.remainingMs(request.attemptCapMs);
    if (remaining === 0) {
      return { kind: "expired", kill: { ok: true }, operationElapsedMs: bound.elapsedMs(), cleanup: null };
    }
    const [program, ...args] = request.argv;
    if (program === undefined || program === "") {
      throw new CommandLaunchError("external command argv is empty");
    }
    const child = await this.launch(program, args, request);
    const watch = new ChildWatch(child, request.stdin, COMMAND_OUTPUT_CAP_BYTES);

    // One timer for the whole attempt: it keeps running while the pipes drain after the exit.
    const deadline = remaining === undefined ? undefined : after(remaining);
    const interruption = request.interruptible === false ? undefined : this.interruption;
    let onInterrupt: (() => void) | undefined;
    const interrupted = new Promise<"interruption">((resolve) => {
      if (!interruption) return;
      onInterrupt = () => resolve("interruption");
      // A pending interruption ends the command at once, with the same kill-and-reap evidence.
      if (interruption.aborted) onInterrupt();
      else interruption.addEventListener("abort", onInterrupt, { once: true });
    });
    const until = async <T>(awaited: Promise<T>, failure?: Promise<Error>): Promise<Ending<T>> =>
      Promise.race<Ending<T>>([
        awaited.then((value) => ({ type: "done", value })),
        interrupted.then(() => ({ type: "interruption" })),
        ...(deadline ? [deadline.promise.then((): Ending<T> => ({ type: "deadline" }))] : []),
        ...(failure ? [failure.then((error): Ending<T> => ({ type: "wait-failure", error }))] : []),
      ]);

    try {
      const exit = await until(watch.exited, watch.waitFailed);
      if (exit.type !== "done") return await this.endEarly(exit, watch, bound, program);
      // The child is gone; its pipes may still be held by a grandchild in its group.
      const io = await until(watch.ioFinished());
      if (io.type !== "done") return await this.endEarly(io, watch, bound, program);

      const stdinError = watch.errorOf("stdin");
      if (stdinError) {
        throw new CommandStdinError(`writing stdin of ${program} failed: ${stdinError.message}`, {
          cause: stdinError,
        });
      }
      for (const name of ["stdout", "stderr"] as const) {
        const error = watch.errorOf(name);
        if (error) {
          throw new CommandWaitError(`reading ${name} of ${program} failed: ${error.message}`, {
            cause: error,
          });
        }
      }
      return {
        kind: "exited",
        code: exit.value.code,
        signal: exit.value.signal,
        stdout: watch.stdout.take(),
        stderr: watch.stderr.take(),
      };
    } finally {
      deadline?.cancel();
      if (onInterrupt) interruption?.removeEventListener("abort", onInterrupt);
    }
  }

  /** Spawns the child in its own process group, or throws `CommandLaunchError`. */
  private async launch(
    program: string,
    args: readonly string[],
    request: CommandRequest,
  ): Promise<ChildProcess> {
    let child: ChildProcess;
    try {
      child = this.spawn(program, args, {
        cwd: request.cwd,
        detached: true,
        stdio: [request.stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      });
    } catch (error) {
      throw new CommandLaunchError(`cannot start ${program}: ${errorMessage(error)}`, { cause: error });
    }
    if (child.pid === undefined) {
      // Node knows a failed spawn at once (no pid) and emits the reason on the next tick.
      const reason = await new Promise<Error>((resolve) => child.once("error", resolve));
      throw new CommandLaunchError(`cannot start ${program}: ${reason.message}`, { cause: reason });
    }
    return child;
  }

  /** Ends a wait that the bound, an interruption or a wait failure cut short: kill, reap, drain. */
  private async endEarly(
    ending: Exclude<Ending<unknown>, { type: "done" }>,
    watch: ChildWatch,
    bound: OperationBound,
    program: string,
  ): Promise<BoundedOutcome> {
    // Taken when the bound fires, before the cleanup spends its graces.
    const operationElapsedMs = bound.elapsedMs();
    const trigger: CleanupTrigger =
      ending.type === "deadline"
        ? "deadline"
        : ending.type === "interruption"
          ? "interruption"
          : "wait_failure";
    const { kill, cleanup } = await killAndReap(watch, this.graces, trigger);
    switch (ending.type) {
      case "deadline":
        return { kind: "expired", kill, operationElapsedMs, cleanup };
      case "interruption":
        return { kind: "interrupted", kill, operationElapsedMs, cleanup };
      case "wait-failure":
        throw new CommandWaitCleanupError(
          `waiting for ${program} failed: ${ending.error.message}`,
          operationElapsedMs,
          cleanup,
          { cause: ending.error },
        );
    }
  }
}

/** A command that exited non-zero, died by a signal, or did not finish in time. */
export class CommandFailedError extends Error {
  override readonly name = "CommandFailedError";
  constructor(
    readonly argv: readonly string[],
    readonly outcome: BoundedOutcome,
  ) {
    super(describeFailure(argv, outcome));
  }
}

function describeFailure(argv: readonly string[], outcome: BoundedOutcome): string {
  const cmd = argv.join(" ");
  switch (outcome.kind) {
    case "exited": {
      const why =
        outcome.code === null ? `killed by ${outcome.signal ?? "a signal"}` : `exit status ${outcome.code}`;
      const stderr = outcome.stderr.toString("utf8").trim();
      return `${cmd}: ${why}${stderr ? `: ${stderr}` : ""}`;
    }
    case "expired":
      return `${cmd}: deadline exceeded after ${outcome.operationElapsedMs} ms`;
    case "interrupted":
      return `${cmd}: interrupted by shutdown after ${outcome.operationElapsedMs} ms`;
  }
}

/** Runs a command and returns its stdout, or throws `CommandFailedError` unless it exited 0. */
export async function runChecked(commands: CommandRunner, request: CommandRequest): Promise<string> {
  const outcome = await commands.run(request);
  if (outcome.kind === "exited" && outcome.code === 0) return outcome.stdout.toString("utf8");
  throw new CommandFailedError(request.argv, outcome);
}
