import { hostname } from "node:os";
import pLimit from "p-limit";
import {
  CliRemovalChannel,
  describeTarget,
  removeContainerViaCli,
  type CliTarget,
} from "../docker/cli-removal.js";
import { LABEL_IS_TASK, LABEL_TASK_ID } from "../docker/docker-client.js";
import {
  describeRemovalReason,
  RemovalUnconfirmedError,
  type RemovalUnconfirmedReason,
} from "../docker/docker-errors.js";
import { OperationBound } from "../exec/operation-bound.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { errorMessage } from "../errors/error-message.js";
import type { ApiPass } from "./fence-api.js";
import {
  FENCE_CONCURRENCY,
  report,
  unseen,
  type FenceHostError,
  type FenceReport,
  type FenceRequest,
  type FenceResult,
} from "./fence-report.js";

/*
 * The fence through the docker CLI, over SSH or locally: list the containers carrying the task
 * label, remove each with the confirmed removal. It settles what the shim's API (fence-api.ts)
 * left pending, or the whole selection when no shim was asked.
 */

/** A container id as `docker container ls --no-trunc` prints it. */
const CONTAINER_ID = /^[0-9a-f]{64}$/;

/** A container the docker CLI listed with the task label. */
export interface TaskContainer {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
}

/** The host could not be listed: nothing is known, so nothing is confirmed. */
export class ListingError extends Error {
  override readonly name = "ListingError";
  constructor(
    readonly reason: string,
    readonly evidence: Readonly<Record<string, unknown>>,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }

  /** The failure as the report's host-level `error`. */
  toHostError(): FenceHostError {
    return { reason: this.reason, detail: this.message, evidence: this.evidence };
  }
}

/** The API's reason for a task it left unconfirmed, kept in the CLI result's evidence. */
function shimNote(result: FenceResult | undefined): Record<string, unknown> {
  if (result === undefined) return {};
  const detail = typeof result.evidence.detail === "string" ? `: ${result.evidence.detail}` : "";
  return { shim: `${result.reason ?? "unconfirmed"}${detail}` };
}

/**
 * Lists the host's task containers through `target` and removes the selected ones; the results
 * the API confirmed (`api`) come first, and its reasons stay in the evidence of what it left.
 */
export async function fenceViaCli(
  commands: CommandRunner,
  target: CliTarget,
  request: FenceRequest,
  api: ApiPass | undefined,
): Promise<FenceReport> {
  const host = target.kind === "local" ? hostname() : describeTarget(target);
  const via = target.kind === "local" ? "local" : "ssh";
  const settled = api?.confirmed ?? [];
  const byTask = new Map((api?.pending ?? []).map((r) => [r.task_id, r]));
  // The tasks still to settle: those the API did not confirm (all of them without an API).
  const open =
    request.selection.kind === "all"
      ? []
      : api === undefined
        ? request.selection.ids
        : api.pending.map((r) => r.task_id ?? "");
  const channel = new CliRemovalChannel(commands, target);
  let containers: TaskContainer[];
  try {
    containers = await listTaskContainers(channel, target, request);
  } catch (error) {
    if (!(error instanceof ListingError)) throw error;
    const hostError = error.toHostError();
    const withShim =
      api === undefined || api.failure === null
        ? hostError
        : {
            ...hostError,
            evidence: { ...hostError.evidence, shim: `${api.failure.reason}: ${api.failure.detail}` },
          };
    return report(host, via, [...settled, ...unseen(open, via, withShim)], withShim);
  }
  const selected =
    request.selection.kind === "all" ? containers : containers.filter((c) => open.includes(c.taskId));
  const missing = open.filter((id) => !containers.some((c) => c.taskId === id));
  const limit = pLimit(FENCE_CONCURRENCY);
  const removed = await Promise.all(
    selected.map((c) =>
      limit(async () => {
        const result = await removeOne(commands, target, c, request.deadlineMs);
        return { ...result, evidence: { ...result.evidence, ...shimNote(byTask.get(c.taskId)) } };
      }),
    ),
  );
  const absent: FenceResult[] = missing.map((id) => ({
    container: null,
    task_id: id,
    outcome: "already_absent",
    reason: null,
    via,
    evidence: {
      detail: "no container with this task id carries the task label",
      ...shimNote(byTask.get(id)),
    },
  }));
  return report(host, via, [...settled, ...removed, ...absent], null);
}

/**
 * The listing's template: one JSON object per line, every value through `json`, so a label
 * holding a newline or a tab stays inside its string and cannot add a row.
 */
export const LISTING_FORMAT = `{"id":{{json .ID}},"name":{{json .Names}},"task_id":{{json (.Label "${LABEL_TASK_ID}")}}}`;

/**
 * Reads `docker container ls --format LISTING_FORMAT`: a line that is not such an object with a
 * 64-hex id is a listing that cannot be trusted, so the whole listing fails (nothing is removed).
 */
export function parseContainerListing(stdout: string): TaskContainer[] {
  const containers: TaskContainer[] = [];
  for (const line of stdout.split("\n")) {
    if (line.trim() === "") continue;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (cause) {
      throw new ListingError(
        "listing",
        { line: line.slice(0, 200) },
        "listing the task containers: a line is not JSON",
        { cause },
      );
    }
    const { id, name, task_id: taskId } = (row ?? {}) as Record<string, unknown>;
    if (
      typeof id !== "string" ||
      !CONTAINER_ID.test(id) ||
      typeof name !== "string" ||
      typeof taskId !== "string"
    ) {
      throw new ListingError(
        "listing",
        { line: line.slice(0, 200) },
        "listing the task containers: a line is not a container (64-hex id, name, task id)",
      );
    }
    containers.push({ id, name, taskId });
  }
  return containers;
}

/** `docker container ls` of the containers with the task label (and the extra labels), bounded. */
async function listTaskContainers(
  channel: CliRemovalChannel,
  target: CliTarget,
  request: FenceRequest,
): Promise<TaskContainer[]> {
  const bound = OperationBound.within(request.deadlineMs);
  const filters = [`${LABEL_IS_TASK}=true`, ...(request.labels ?? [])].flatMap((label) => [
    "--filter",
    `label=${label}`,
  ]);
  let outcome;
  try {
    outcome = await channel.run(
      ["container", "ls", "--all", "--no-trunc", ...filters, "--format", LISTING_FORMAT],
      bound,
    );
  } catch (error) {
    throw new ListingError(
      target.kind === "ssh" ? "ssh" : "launch",
      { elapsed_ms: bound.elapsedMs() },
      errorMessage(error),
      { cause: error },
    );
  }
  if (outcome.kind !== "exited") {
    throw new ListingError(
      outcome.kind === "expired" ? "deadline" : "wait",
      { operation_elapsed_ms: outcome.operationElapsedMs, cleanup: outcome.cleanup },
      outcome.kind === "expired"
        ? `listing the task containers: deadline exceeded after ${outcome.operationElapsedMs} ms`
        : "listing the task containers: interrupted",
    );
  }
  const stderr = outcome.stderr.toString("utf8").trim();
  if (outcome.code !== 0) {
    // ssh's own failures (unreachable, refused, authentication) exit 255.
    throw new ListingError(
      outcome.code === 255 ? "ssh" : "exit",
      { code: outcome.code, stderr },
      // ssh's own complaint (after any banner or warning lines) is its last line.
      `listing the task containers: exit status ${outcome.code}: ${stderr.split("\n").at(-1) ?? ""}`,
    );
  }
  return parseContainerListing(outcome.stdout.toString("utf8"));
}

/** The reason's own fields, in the JSON's snake_case: the client's cleanup evidence above all. */
function reasonEvidence(reason: RemovalUnconfirmedReason): Record<string, unknown> {
  switch (reason.kind) {
    case "deadline":
      return { operation_elapsed_ms: reason.elapsedMs, cleanup: reason.cleanup };
    case "wait_cleanup":
      return { operation_elapsed_ms: reason.elapsedMs, cleanup: reason.cleanup };
    case "exit":
      return { code: reason.code, stderr: reason.stderr };
    case "launch":
    case "ssh":
    case "wait":
    case "engine":
      return {};
  }
}

/** The seed's confirmed removal of one listed container, by id (a name may be reused). */
async function removeOne(
  commands: CommandRunner,
  target: CliTarget,
  container: TaskContainer,
  deadlineMs: number,
): Promise<FenceResult> {
  const bound = OperationBound.within(deadlineMs);
  const base = {
    container: container.name,
    task_id: container.taskId || null,
    via: target.kind === "local" ? ("local" as const) : ("ssh" as const),
  };
  try {
    const confirmed = await removeContainerViaCli(commands, container.id, target, bound);
    return {
      ...base,
      outcome: confirmed === "removed" ? "removed" : "already_absent",
      reason: null,
      evidence: { elapsed_ms: bound.elapsedMs(), container_id: container.id },
    };
  } catch (error) {
    if (!(error instanceof RemovalUnconfirmedError)) throw error;
    return {
      ...base,
      outcome: "unconfirmed",
      reason: error.reason.kind,
      evidence: {
        elapsed_ms: bound.elapsedMs(),
        container_id: container.id,
        detail: describeRemovalReason(error.reason),
        ...reasonEvidence(error.reason),
      },
    };
  }
}
