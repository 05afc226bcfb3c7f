import { setTimeout as sleep } from "node:timers/promises";
import { OperationBound } from "../exec/operation-bound.js";
import { CommandLaunchError, CommandWaitCleanupError, type CommandRunner } from "../exec/run-bounded.js";
import type { RemovalConfirmed } from "./docker-client.js";
import { RemovalUnconfirmedError } from "./docker-errors.js";
import { shellQuote } from "./container-spec.js";

/** How long a removal may take before it is reported as unconfirmed. */
export const REMOVAL_TIMEOUT_MS = 30_000;
const POLL_INTERVAL_MS = 250;
/** ssh's own exit status for a connection or authentication failure. */
const SSH_FAILURE_STATUS = 255;

/** Where the container lives: this host, or a launch machine reached over SSH. */
export type RemovalTarget =
  | { readonly kind: "local" }
  | {
      readonly kind: "ssh";
      readonly host: string;
      readonly user?: string;
      readonly port?: number;
      readonly identityFile?: string;
      /** Seconds to wait for the TCP connection (default 10). */
      readonly connectTimeoutS?: number;
    };

/** The `--gpus` argv pair for a device list: quoted, or docker splits `device=0,1` on the comma. */
export function dockerGpuArgs(devices: string): [string, string] {
  return ["--gpus", `"device=${devices}"`];
}

/** The ssh argv prefix for a target: bounded connect, keepalives, never a password prompt. */
export function sshArgv(target: Extract<RemovalTarget, { kind: "ssh" }>): string[] {
  return [
    "ssh",
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

function dockerArgv(target: RemovalTarget, args: readonly string[]): string[] {
  if (target.kind === "local") return ["docker", ...args];
  // The remote side runs a shell: every word is quoted, the container name above all.
  return [...sshArgv(target), ["docker", ...args].map(shellQuote).join(" ")];
}

type Attempt =
  | {
      readonly kind: "exited";
      readonly code: number | null;
      readonly stderr: string;
      readonly stdout: string;
    }
  | { readonly kind: "failed"; readonly error: RemovalUnconfirmedError };

async function attempt(
  runner: CommandRunner,
  container: string,
  target: RemovalTarget,
  args: readonly string[],
  bound: OperationBound,
): Promise<Attempt> {
  try {
    // Removal is cleanup: an operator interruption must not leave it half-done.
    const outcome = await runner.run({ argv: dockerArgv(target, args), bound, interruptible: false });
    switch (outcome.kind) {
      case "exited": {
        const stderr = outcome.stderr.toString("utf8").trim();
        if (target.kind === "ssh" && outcome.code === SSH_FAILURE_STATUS) {
          return {
            kind: "failed",
            error: new RemovalUnconfirmedError(container, { kind: "ssh", detail: stderr }),
          };
        }
        return { kind: "exited", code: outcome.code, stderr, stdout: outcome.stdout.toString("utf8").trim() };
      }
      case "expired":
      case "interrupted":
        return {
          kind: "failed",
          error: new RemovalUnconfirmedError(container, {
            kind: "deadline",
            elapsedMs: outcome.operationElapsedMs,
            cleanup: outcome.cleanup,
          }),
        };
    }
  } catch (error) {
    const kind = error instanceof CommandLaunchError ? "launch" : "wait";
    const detail = (error as Error).message;
    const reason =
      error instanceof CommandWaitCleanupError
        ? ({ kind: "deadline", elapsedMs: error.operationElapsedMs, cleanup: error.cleanup } as const)
        : ({ kind, detail } as const);
    return { kind: "failed", error: new RemovalUnconfirmedError(container, reason, { cause: error }) };
  }
}

const NO_SUCH_CONTAINER = /no such container/i;
const IN_PROGRESS = /removal of container .* is already in progress/i;

/**
 * Removes a container through the docker CLI, here or over SSH, and confirms it is gone, all
 * within one 30 s deadline: removed = confirmed; "no such container" = confirmed, already
 * absent; "removal already in progress" = poll until gone; anything else throws
 * `RemovalUnconfirmedError` with a typed reason.
 */
export async function removeContainerViaCli(
  runner: CommandRunner,
  container: string,
  target: RemovalTarget = { kind: "local" },
  bound: OperationBound = OperationBound.within(REMOVAL_TIMEOUT_MS),
): Promise<RemovalConfirmed> {
  const removal = await attempt(runner, container, target, ["rm", "--force", "--volumes", container], bound);
  if (removal.kind === "failed") throw removal.error;
  // `rm --force` exits 0 for a container that is already gone, which confirms the removal too.
  if (removal.code === 0) return "removed";
  if (NO_SUCH_CONTAINER.test(removal.stderr)) return "already-absent";
  if (!IN_PROGRESS.test(removal.stderr)) {
    throw new RemovalUnconfirmedError(container, {
      kind: "exit-status",
      code: removal.code,
      stderr: removal.stderr,
    });
  }
  while (!bound.expired()) {
    // `docker container inspect` (not `docker inspect`) says "No such container" once it is gone.
    const probe = await attempt(
      runner,
      container,
      target,
      ["container", "inspect", "--format", "{{.Id}}", container],
      bound,
    );
    if (probe.kind === "failed") throw probe.error;
    if (probe.code !== 0 && NO_SUCH_CONTAINER.test(probe.stderr)) return "removed";
    await sleep(Math.min(POLL_INTERVAL_MS, bound.remainingMs() ?? POLL_INTERVAL_MS));
  }
  throw new RemovalUnconfirmedError(container, {
    kind: "deadline",
    elapsedMs: bound.elapsedMs(),
    cleanup: null,
  });
}
