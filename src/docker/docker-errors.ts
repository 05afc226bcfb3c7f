import type { CleanupEvidence } from "../exec/cleanup-evidence.js";

/** The engine did not answer (socket missing, connection refused, deadline exceeded). */
export class DockerUnavailableError extends Error {
  override readonly name = "DockerUnavailableError";
}

/** The engine answered with an error status. */
export class DockerApiError extends Error {
  override readonly name: string = "DockerApiError";
  constructor(
    message: string,
    readonly statusCode: number,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** 404: no such container or image. */
export class DockerNotFoundError extends DockerApiError {
  override readonly name = "DockerNotFoundError";
}

/** 409: a name conflict, or a removal already in progress. */
export class DockerConflictError extends DockerApiError {
  override readonly name = "DockerConflictError";
}

/**
 * Why a container removal could not be confirmed (the seed's `RemovalFailure`). Where a docker
 * client process ran and had to be killed, the reason carries that cleanup's evidence.
 */
export type RemovalUnconfirmedReason =
  /** The docker client (or the Engine API call) could not be started. */
  | { readonly kind: "launch"; readonly detail: string }
  /** The ssh client could not be started, or the remote end could not be reached. */
  | { readonly kind: "ssh"; readonly detail: string }
  /** Waiting for the client failed without a cleanup, or the removal was interrupted. */
  | { readonly kind: "wait"; readonly detail: string }
  /** Waiting for the client failed; it was killed, and this is what the cleanup saw. */
  | {
      readonly kind: "wait_cleanup";
      readonly detail: string;
      readonly elapsedMs: number;
      readonly cleanup: CleanupEvidence;
    }
  /**
   * The removal deadline ran out; `cleanup` is the killed client's evidence (null when no client
   * had to be killed: an Engine API call, or a bound that expired between two calls).
   */
  | {
      readonly kind: "deadline";
      readonly elapsedMs: number;
      readonly cleanup: CleanupEvidence | null;
      readonly detail?: string;
    }
  /** The docker client exited non-zero with an answer that confirms nothing. */
  | { readonly kind: "exit"; readonly code: number | null; readonly stderr: string }
  /** The Engine API answered with an error that confirms nothing. */
  | { readonly kind: "engine"; readonly detail: string };

/** A removal that did not reach a confirmed end: the container may still exist. */
export class RemovalUnconfirmedError extends Error {
  override readonly name = "RemovalUnconfirmedError";
  constructor(
    readonly container: string,
    readonly reason: RemovalUnconfirmedReason,
    options?: ErrorOptions,
  ) {
    super(`removal of container ${container} not confirmed: ${describeRemovalReason(reason)}`, options);
  }
}

/** One line for a reason, as logs and the fence table print it. */
export function describeRemovalReason(reason: RemovalUnconfirmedReason): string {
  switch (reason.kind) {
    case "launch":
    case "wait":
    case "ssh":
    case "engine":
      return `${reason.kind}: ${reason.detail}`;
    case "wait_cleanup":
      return `wait failed after ${reason.elapsedMs} ms: ${reason.detail}`;
    case "deadline":
      return `deadline exceeded after ${reason.elapsedMs} ms${reason.detail ? ` (${reason.detail})` : ""}`;
    case "exit":
      return `exit status ${reason.code ?? "signal"}: ${reason.stderr}`;
  }
}

interface DockerodeErrorShape {
  statusCode?: number;
  reason?: string;
  json?: { message?: string } | string | null;
  code?: string;
  message?: string;
  name?: string;
}

/** Maps a dockerode/docker-modem error (or an abort) to one of the typed errors above. */
export function mapDockerError(error: unknown, operation: string): Error {
  if (error instanceof DockerApiError || error instanceof DockerUnavailableError) return error;
  const e = (error ?? {}) as DockerodeErrorShape;
  if (typeof e.statusCode === "number") {
    // Streamed calls (pull, events) carry the engine's message only in the error text:
    // "(HTTP code 500) server error - <message> ".
    const fromText = /^\(HTTP code \d+\) [^-]*- (.*)$/s.exec(e.message ?? "")?.[1]?.trim();
    const detail =
      (typeof e.json === "object" && e.json?.message) ||
      (typeof e.json === "string" ? e.json : "") ||
      fromText ||
      e.reason ||
      "";
    const message = `${operation}: ${detail || `HTTP ${e.statusCode}`}`.trim();
    if (e.statusCode === 404) return new DockerNotFoundError(message, 404, { cause: error });
    if (e.statusCode === 409) return new DockerConflictError(message, 409, { cause: error });
    return new DockerApiError(message, e.statusCode, { cause: error });
  }
  const why =
    e.name === "AbortError" || e.code === "ABORT_ERR" ? "deadline exceeded or cancelled" : e.message;
  return new DockerUnavailableError(`${operation}: docker engine unavailable: ${why ?? String(error)}`, {
    cause: error,
  });
}
