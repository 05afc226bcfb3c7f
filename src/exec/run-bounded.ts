import { spawn, type ChildProcess } from "node:child_process";
import type { CleanupEvidence, CleanupTrigger } from "./cleanup-evidence.js";
import { OperationBound } from "./operation-bound.js";

/** Grace for the killed process group to be reaped. */
export const COMMAND_REAP_GRACE_MS = 5_000;
/** Grace for stdout/stderr to reach EOF once the child is gone. */
export const COMMAND_IO_DRAIN_GRACE_MS = 5_000;
/** Output kept per stream; the rest is drained and dropped so a chatty child cannot exhaust memory. */
export const COMMAND_OUTPUT_CAP_BYTES = 8 * 1024 * 1024;

/** One external command invocation. */
export interface CommandRequest {
  readonly argv: readonly string[];
  readonly cwd?: string;
  /** Written to the child's stdin without blocking the wait; stdin is closed afterwards. */
  readonly stdin?: string | Buffer;
  /** The deadline of the whole operation; defaults to unbounded. */
  readonly bound?: OperationBound;
  /** A cap for this one attempt, never past the operation's deadline. */
  readonly attemptCapMs?: number;
  /** Whether an operator interruption (SIGINT/SIGTERM to the shim) kills this command. Default true. */
  readonly interruptible?: boolean;
}

/** The result of killing a process group. */
export type KillResult = { readonly ok: true } | { readonly ok: false; readonly error: string };

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
      readonly operationElapsedMs: number;
      /** null when the bound had already expired and nothing was spawned. */
      readonly cleanup: CleanupEvidence | null;
    }
  | {
      readonly kind: "interrupted";
      readonly kill: KillResult;
      readonly operationElapsedMs: number;
      readonly cleanup: CleanupEvidence;
    };

/** The command could not be started (empty argv, missing binary, bad cwd…). */
export class CommandLaunchError extends Error {
  override readonly name = "CommandLaunchError";
}
/** Writing the stdin payload failed for a reason other than the child closing its stdin. */
export class CommandStdinError extends Error {
  override readonly name = "CommandStdinError";
}
/** Waiting for the child failed and no cleanup was needed. */
export class CommandWaitError extends Error {
  override readonly name = "CommandWaitError";
}
/** Waiting failed; the process group was killed, and this is what the cleanup saw. */
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

/** A bounded output collector: keeps the first `cap` bytes, drains the rest. */
class Collector {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly cap: number) {}
  push(chunk: Buffer): void {
    if (this.size >= this.cap) return;
    const room = this.cap - this.size;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.chunks.push(kept);
    this.size += kept.length;
  }
  take(): Buffer {
    return Buffer.concat(this.chunks, this.size);
  }
}

function killGroup(child: ChildProcess): KillResult {
  if (child.pid === undefined) return { ok: false, error: "no pid" };
  try {
    // A negative pid addresses the whole process group the child leads (spawned detached).
    process.kill(-child.pid, "SIGKILL");
    return { ok: true };
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // ESRCH: the group is already gone, which is what we wanted.
    return code === "ESRCH" ? { ok: true } : { ok: false, error: String(error) };
  }
}

function after(ms: number): { promise: Promise<"timeout">; cancel: () => void } {
  let timer: NodeJS.Timeout | undefined;
  const promise = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), ms);
  });
  return { promise, cancel: () => clearTimeout(timer) };
}

/**
 * Runs external commands in their own process group, drains both pipes from the start
 * (a child that fills a pipe would otherwise block forever), and kills and reaps the whole
 * group on a deadline or an operator interruption, leaving typed evidence.
 *
 * Hand-written because neither `child_process.execFile` nor execa kills a process group,
 * verifies the reap, or reports what the cleanup saw.
 */
export class BoundedCommandRunner implements CommandRunner {
  constructor(
    /** Aborted when the operator interrupts the shim (SIGINT/SIGTERM). */
    private readonly interruption?: AbortSignal,
    private readonly graces = { reapMs: COMMAND_REAP_GRACE_MS, drainMs: COMMAND_IO_DRAIN_GRACE_MS },
  ) {}

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
    const interruption = request.interruptible === false ? undefined : this.interruption;

    const child = spawn(program, args, {
      cwd: request.cwd,
      detached: true,
      stdio: [request.stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"],
    });
    const stdout = new Collector(COMMAND_OUTPUT_CAP_BYTES);
    const stderr = new Collector(COMMAND_OUTPUT_CAP_BYTES);
    child.stdout?.on("data", (chunk: Buffer) => stdout.push(chunk));
    child.stderr?.on("data", (chunk: Buffer) => stderr.push(chunk));

    let stdinError: Error | undefined;
    if (request.stdin !== undefined && child.stdin) {
      child.stdin.on("error", (error: NodeJS.ErrnoException) => {
        // EPIPE only means the child did not read everything before closing stdin.
        if (error.code !== "EPIPE") stdinError = error;
      });
      child.stdin.end(request.stdin);
    }

    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.once("exit", (code, signal) => resolve({ code, signal })),
    );
    const drained = new Promise<void>((resolve) => child.once("close", () => resolve()));
    const launchFailed = new Promise<Error>((resolve) => child.once("error", resolve));

    type Ending =
      | { readonly type: "exit"; readonly code: number | null; readonly signal: NodeJS.Signals | null }
      | { readonly type: "launch-error"; readonly error: Error }
      | { readonly type: "deadline" }
      | { readonly type: "interruption" };

    const deadline = remaining === undefined ? undefined : after(remaining);
    let onInterrupt: (() => void) | undefined;
    const interrupted = new Promise<Ending>((resolve) => {
      if (!interruption) return;
      onInterrupt = () => resolve({ type: "interruption" });
      // A pending interruption ends the command at once, with the same kill-and-reap evidence.
      if (interruption.aborted) onInterrupt();
      else interruption.addEventListener("abort", onInterrupt, { once: true });
    });
    const ending: Ending = await Promise.race<Ending>([
      exited.then((status) => ({ type: "exit", ...status })),
      launchFailed.then((error) => ({ type: "launch-error", error })),
      ...(deadline ? [deadline.promise.then((): Ending => ({ type: "deadline" }))] : []),
      interrupted,
    ]);
    deadline?.cancel();
    if (onInterrupt) interruption?.removeEventListener("abort", onInterrupt);

    switch (ending.type) {
      case "launch-error":
        if (child.pid === undefined) {
          throw new CommandLaunchError(`cannot start ${program}: ${ending.error.message}`, {
            cause: ending.error,
          });
        }
        return this.failWait(child, bound, ending.error, exited, drained);
      case "exit": {
        // The child is gone; its pipes may still be held by a grandchild in its group.
        const drain = after(this.graces.drainMs);
        const result = await Promise.race([drained.then(() => "drained" as const), drain.promise]);
        drain.cancel();
        if (result === "timeout") {
          killGroup(child);
          child.stdout?.destroy();
          child.stderr?.destroy();
        }
        if (stdinError) {
          throw new CommandStdinError(`writing stdin of ${program} failed: ${stdinError.message}`, {
            cause: stdinError,
          });
        }
        return {
          kind: "exited",
          code: ending.code,
          signal: ending.signal,
          stdout: stdout.take(),
          stderr: stderr.take(),
        };
      }
      case "deadline":
      case "interruption": {
        const trigger: CleanupTrigger = ending.type === "deadline" ? "deadline" : "interruption";
        const { kill, cleanup } = await this.killAndReap(child, trigger, exited, drained);
        return ending.type === "deadline"
          ? { kind: "expired", kill, operationElapsedMs: bound.elapsedMs(), cleanup }
          : { kind: "interrupted", kill, operationElapsedMs: bound.elapsedMs(), cleanup };
      }
    }
  }

  private async failWait(
    child: ChildProcess,
    bound: OperationBound,
    error: Error,
    exited: Promise<unknown>,
    drained: Promise<void>,
  ): Promise<never> {
    const { cleanup } = await this.killAndReap(child, "wait_failure", exited, drained);
    throw new CommandWaitCleanupError(
      `waiting for command failed: ${error.message}`,
      bound.elapsedMs(),
      cleanup,
      {
        cause: error,
      },
    );
  }

  private async killAndReap(
    child: ChildProcess,
    trigger: CleanupTrigger,
    exited: Promise<unknown>,
    drained: Promise<void>,
  ): Promise<{ kill: KillResult; cleanup: CleanupEvidence }> {
    const started = Date.now();
    const kill = killGroup(child);
    const reap = after(this.graces.reapMs);
    const reaped = (await Promise.race([exited.then(() => "reaped" as const), reap.promise])) === "reaped";
    reap.cancel();
    const drain = after(this.graces.drainMs);
    const pipesClosed =
      (await Promise.race([drained.then(() => "drained" as const), drain.promise])) === "drained";
    drain.cancel();
    if (!pipesClosed) {
      child.stdout?.destroy();
      child.stderr?.destroy();
    }
    const problems = [
      kill.ok ? undefined : `kill failed: ${kill.error}`,
      reaped ? undefined : `not reaped within ${this.graces.reapMs} ms`,
      pipesClosed ? undefined : `pipes not drained within ${this.graces.drainMs} ms`,
    ].filter((p): p is string => p !== undefined);
    return {
      kill,
      cleanup: {
        trigger,
        elapsed_ms: Date.now() - started,
        reap_grace_ms: this.graces.reapMs,
        io_drain_grace_ms: this.graces.drainMs,
        kill_attempted: true,
        verified: reaped && pipesClosed,
        error: problems.length > 0 ? problems.join("; ") : null,
      },
    };
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
export async function runChecked(runner: CommandRunner, request: CommandRequest): Promise<string> {
  const outcome = await runner.run(request);
  if (outcome.kind === "exited" && outcome.code === 0) return outcome.stdout.toString("utf8");
  throw new CommandFailedError(request.argv, outcome);
}
