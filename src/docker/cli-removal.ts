import { OperationBound } from "../exec/operation-bound.js";
import {
  CommandLaunchError,
  CommandStdinError,
  CommandWaitCleanupError,
  CommandWaitError,
  type BoundedOutcome,
  type CommandRunner,
} from "../exec/run-bounded.js";
import {
  confirmRemoval,
  REMOVAL_TIMEOUT_MS,
  type InspectAnswer,
  type RemovalChannel,
  type RemoveAnswer,
} from "./confirmed-removal.js";
import type { RemovalConfirmed } from "./docker-client.js";
import type { RemovalUnconfirmedReason } from "./docker-errors.js";
import { shellQuote } from "./container-spec.js";
import { errorMessage } from "../errors/error-message.js";

/** An SSH destination: `[user@]host[:port]`, and how to authenticate. */
export interface SshTarget {
  readonly kind: "ssh";
  readonly host: string;
  readonly user?: string;
  readonly port?: number;
  readonly identityFile?: string;
  /** Seconds to wait for the TCP connection and the handshake (default 10). */
  readonly connectTimeoutS?: number;
  /** Extra `-o` options (`StrictHostKeyChecking=accept-new`…); they override the fixed ones. */
  readonly options?: readonly string[];
}

/** Where the docker CLI runs: this host, or a launch machine reached over SSH. */
export type CliTarget = { readonly kind: "local" } | SshTarget;

/** `[user@]host[:port]`, as the operator wrote it. */
export function describeTarget(target: CliTarget): string {
  if (target.kind === "local") return "local";
  const who = target.user !== undefined ? `${target.user}@${target.host}` : target.host;
  return target.port !== undefined ? `${who}:${target.port}` : who;
}

/**
 * The ssh argv prefix for a target: never a password prompt (BatchMode), a bounded connect,
 * keepalives that notice a dead connection within ~10 s. Host keys are checked as the user's ssh
 * config says; `options` come first, so they override all of this. None of this bounds a live connection to a wedged
 * daemon: `BoundedCommandRunner` does.
 */
function sshArgv(target: SshTarget): string[] {
  return [
    "ssh",
    // ssh keeps the first value it reads for an option: the operator's come first, so they win.
    ...(target.options ?? []).flatMap((option) => ["-o", option]),
    "-o",
    "BatchMode=yes",
    "-o",
    `ConnectTimeout=${target.connectTimeoutS ?? 10}`,
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=2",
    ...(target.port !== undefined ? ["-p", String(target.port)] : []),
    ...(target.identityFile !== undefined ? ["-i", target.identityFile] : []),
    "--",
    target.user !== undefined ? `${target.user}@${target.host}` : target.host,
  ];
}

/** The argv that runs `docker args…` on the target. */
function dockerArgv(target: CliTarget, args: readonly string[]): string[] {
  if (target.kind === "local") return ["docker", ...args];
  // The remote side runs a shell: every word is quoted, the container name above all.
  return [...sshArgv(target), ["docker", ...args].map(shellQuote).join(" ")];
}

const NO_SUCH_CONTAINER = "No such container";
const IN_PROGRESS = "is already in progress";

/** A client that ended without exiting, or never ran: the seed's mapping of each to a reason. */
function failureOf(outcome: Exclude<BoundedOutcome, { kind: "exited" }>): RemovalUnconfirmedReason {
  return outcome.kind === "expired"
    ? { kind: "deadline", elapsedMs: outcome.operationElapsedMs, cleanup: outcome.cleanup }
    : { kind: "wait", detail: "container cleanup was interrupted" };
}

function errorReason(target: CliTarget, error: unknown): RemovalUnconfirmedReason {
  const detail = errorMessage(error);
  if (error instanceof CommandLaunchError) {
    return target.kind === "ssh"
      ? { kind: "ssh", detail: `failed to launch SSH for ${describeTarget(target)}: ${detail}` }
      : { kind: "launch", detail };
  }
  if (error instanceof CommandWaitCleanupError) {
    return { kind: "wait_cleanup", detail, elapsedMs: error.operationElapsedMs, cleanup: error.cleanup };
  }
  if (error instanceof CommandStdinError || error instanceof CommandWaitError)
    return { kind: "wait", detail };
  throw error;
}

/**
 * The docker CLI as a {@link RemovalChannel}, here or over SSH. Removal is cleanup: an operator
 * interruption must not leave it half-done, so its commands are not interruptible.
 */
export class CliRemovalChannel implements RemovalChannel {
  constructor(
    private readonly commands: CommandRunner,
    private readonly target: CliTarget = { kind: "local" },
  ) {}

  async remove(container: string, bound: OperationBound): Promise<RemoveAnswer> {
    let outcome: BoundedOutcome;
    try {
      outcome = await this.run(["rm", "--force", "--volumes", container], bound);
    } catch (error) {
      return { kind: "failed", reason: errorReason(this.target, error) };
    }
    if (outcome.kind !== "exited") return { kind: "failed", reason: failureOf(outcome) };
    if (outcome.code === 0) return { kind: "removed" };
    const stderr = outcome.stderr.toString("utf8").trim();
    if (stderr.includes(NO_SUCH_CONTAINER)) return { kind: "absent" };
    if (stderr.includes(IN_PROGRESS)) return { kind: "in-progress" };
    return { kind: "failed", reason: { kind: "exit", code: outcome.code, stderr } };
  }

  async inspect(container: string, bound: OperationBound): Promise<InspectAnswer> {
    try {
      // `docker container inspect` (not `docker inspect`) says "No such container" once it is gone.
      const outcome = await this.run(["container", "inspect", "--format", "{{.Id}}", container], bound);
      if (outcome.kind === "exited") {
        const gone = outcome.code !== 0 && outcome.stderr.toString("utf8").includes(NO_SUCH_CONTAINER);
        return gone ? { kind: "absent" } : { kind: "unknown", cleanup: null };
      }
      return { kind: "unknown", cleanup: outcome.cleanup };
    } catch (error) {
      // A launch or wait failure proves nothing either; the deadline decides.
      return { kind: "unknown", cleanup: error instanceof CommandWaitCleanupError ? error.cleanup : null };
    }
  }

  /** Runs `docker args…` on the target under the removal's bound. */
  run(args: readonly string[], bound: OperationBound): Promise<BoundedOutcome> {
    return this.commands.run({ argv: dockerArgv(this.target, args), bound, interruptible: false });
  }
}

/**
 * Removes a container through the docker CLI, here or over SSH, and confirms it is gone within one
 * 30 s deadline (see {@link confirmRemoval}); throws `RemovalUnconfirmedError` otherwise.
 */
export function removeContainerViaCli(
  commands: CommandRunner,
  container: string,
  target: CliTarget = { kind: "local" },
  bound: OperationBound = OperationBound.within(REMOVAL_TIMEOUT_MS),
): Promise<RemovalConfirmed> {
  return confirmRemoval(new CliRemovalChannel(commands, target), container, bound);
}
