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
import { ShimClient, ShimHttpError, ShimUnreachableError } from "./shim-client.js";
import { errorMessage } from "../errors/error-message.js";

/** `--deadline`'s default: the seed's removal deadline. */
export const FENCE_DEFAULT_DEADLINE_MS = 30_000;
/** Removals run at once on one host. */
const FENCE_CONCURRENCY = 4;

/** Which of a host's task containers to fence. */
export type FenceSelection =
  { readonly kind: "all" } | { readonly kind: "tasks"; readonly ids: readonly string[] };

/** How one task container ended. */
export type FenceOutcome = "removed" | "already_absent" | "unconfirmed";

/** One container (or one requested task) of a fence. */
export interface FenceResult {
  /** The container's name; null when no container was found (or the host could not be listed). */
  readonly container: string | null;
  readonly task_id: string | null;
  readonly outcome: FenceOutcome;
  /** Why it is unconfirmed (`deadline`, `ssh`, `exit`…); null when confirmed. */
  readonly reason: string | null;
  readonly evidence: Readonly<Record<string, unknown>>;
}

/** What `taskshim fence --json` prints. */
export interface FenceReport {
  readonly host: string;
  readonly via: "api" | "ssh" | "local";
  /** True only when every result is confirmed (and the host could be listed). */
  readonly confirmed: boolean;
  readonly results: readonly FenceResult[];
}

/** A fence request, parsed from the command line. */
export interface FenceRequest {
  /** Ask this shim first (`--shim`). */
  readonly shimUrl?: string;
  /** Bearer token for the shim. */
  readonly authToken?: string;
  /** Where the docker CLI runs (`--ssh` or `--local`), first or as the fallback of `--shim`. */
  readonly cli?: CliTarget;
  readonly selection: FenceSelection;
  /** Bounds each removal, each listing and each shim call. */
  readonly deadlineMs: number;
  /** Extra `KEY=VALUE` labels a container must carry too (narrows, never widens). */
  readonly labels?: readonly string[];
}

/** A container the docker CLI listed with the task label. */
interface TaskContainer {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
}

/** The host could not be listed: nothing is known, so nothing is confirmed. */
class ListingError extends Error {
  override readonly name = "ListingError";
  constructor(
    readonly reason: string,
    readonly evidence: Readonly<Record<string, unknown>>,
    message: string,
  ) {
    super(message);
  }
}

function report(host: string, via: FenceReport["via"], results: FenceResult[], listed: boolean): FenceReport {
  return { host, via, confirmed: listed && results.every((r) => r.outcome !== "unconfirmed"), results };
}

/** Results for a host that could not be listed: one unconfirmed row per requested task. */
function unlisted(selection: FenceSelection, error: ListingError): FenceResult[] {
  if (selection.kind === "all") return [];
  return selection.ids.map((id) => ({
    container: null,
    task_id: id,
    outcome: "unconfirmed",
    reason: error.reason,
    evidence: { ...error.evidence, detail: error.message },
  }));
}

/**
 * Fences a host: makes sure its task containers are dead before a control plane runs the tasks
 * elsewhere. `--shim` first (terminate with timeout 0, remove, confirm through the API); when the
 * shim does not answer and a CLI target is given, the docker CLI there (over SSH, or locally):
 * list the containers carrying the task label, remove each with the confirmed removal.
 */
export async function fence(commands: CommandRunner, request: FenceRequest): Promise<FenceReport> {
  if (request.shimUrl !== undefined) {
    const viaApi = await fenceViaShim(request.shimUrl, request);
    // Fall back only when the shim did not answer; an answer (even an error) is the shim's word.
    if (viaApi.kind === "answered" || request.cli === undefined) return viaApi.report;
  }
  if (request.cli === undefined) throw new Error("fence needs --shim, --ssh or --local");
  return fenceViaCli(commands, request.cli, request);
}

// --- the shim's API --------------------------------------------------------------------------

async function fenceViaShim(
  url: string,
  request: FenceRequest,
): Promise<{ kind: "answered" | "unreachable"; report: FenceReport }> {
  const client = new ShimClient(
    url,
    request.deadlineMs,
    request.authToken === undefined ? {} : { authToken: request.authToken },
  );
  const host = new URL(url).host;
  const started = Date.now();
  let ids: string[];
  try {
    const listed = (await client.listTasks()).map((t) => t.id);
    ids = request.selection.kind === "all" ? listed : [...request.selection.ids];
  } catch (error) {
    const listing = new ListingError(
      error instanceof ShimUnreachableError ? "shim_unreachable" : "shim",
      { elapsed_ms: Date.now() - started, detail: errorMessage(error) },
      `cannot list the tasks of ${url}: ${errorMessage(error)}`,
    );
    return {
      kind: error instanceof ShimUnreachableError ? "unreachable" : "answered",
      report: { ...report(host, "api", unlisted(request.selection, listing), false) },
    };
  }
  const limit = pLimit(FENCE_CONCURRENCY);
  const results = await Promise.all(ids.map((id) => limit(() => fenceTaskViaShim(client, id))));
  const unreachable = results.some((r) => r.reason === "shim_unreachable");
  return { kind: unreachable ? "unreachable" : "answered", report: report(host, "api", results, true) };
}

/** Terminate (timeout 0), remove, then confirm that the shim no longer knows the task. */
async function fenceTaskViaShim(client: ShimClient, id: string): Promise<FenceResult> {
  const started = Date.now();
  const steps: string[] = [];
  let container: string | null = null;
  const result = (outcome: FenceOutcome, reason: string | null, detail?: string): FenceResult => ({
    container,
    task_id: id,
    outcome,
    reason,
    evidence: { elapsed_ms: Date.now() - started, steps, ...(detail === undefined ? {} : { detail }) },
  });
  try {
    const task = await client.terminateTask(id, "terminated_by_server", "fenced by taskshim fence", 0);
    container = task.container_name || null;
    steps.push(`terminate: ${task.status}`);
    await client.removeTask(id);
    steps.push("remove: ok");
  } catch (error) {
    if (error instanceof ShimHttpError && error.status === 404 && steps.length === 0) {
      steps.push("terminate: 404");
      return result("already_absent", null);
    }
    const reason = error instanceof ShimUnreachableError ? "shim_unreachable" : "shim";
    return result("unconfirmed", reason, errorMessage(error));
  }
  try {
    await client.getTask(id);
    steps.push("confirm: the task is still listed");
    return result("unconfirmed", "shim", "the shim still knows the task after removing it");
  } catch (error) {
    if (error instanceof ShimHttpError && error.status === 404) {
      steps.push("confirm: 404");
      return result("removed", null);
    }
    const reason = error instanceof ShimUnreachableError ? "shim_unreachable" : "shim";
    return result("unconfirmed", reason, errorMessage(error));
  }
}

// --- the docker CLI, over SSH or locally -----------------------------------------------------

async function fenceViaCli(
  commands: CommandRunner,
  target: CliTarget,
  request: FenceRequest,
): Promise<FenceReport> {
  const host = target.kind === "local" ? hostname() : describeTarget(target);
  const via = target.kind === "local" ? "local" : "ssh";
  const channel = new CliRemovalChannel(commands, target);
  let containers: TaskContainer[];
  try {
    containers = await listTaskContainers(channel, target, request);
  } catch (error) {
    if (!(error instanceof ListingError)) throw error;
    return report(host, via, unlisted(request.selection, error), false);
  }
  const selected =
    request.selection.kind === "all"
      ? containers
      : containers.filter(
          (c) => request.selection.kind === "tasks" && request.selection.ids.includes(c.taskId),
        );
  const missing =
    request.selection.kind === "all"
      ? []
      : request.selection.ids.filter((id) => !containers.some((c) => c.taskId === id));
  const limit = pLimit(FENCE_CONCURRENCY);
  const removed = await Promise.all(
    selected.map((c) => limit(() => removeOne(commands, target, c, request.deadlineMs))),
  );
  const absent: FenceResult[] = missing.map((id) => ({
    container: null,
    task_id: id,
    outcome: "already_absent",
    reason: null,
    evidence: { detail: "no container with this task id carries the task label" },
  }));
  return report(host, via, [...removed, ...absent], true);
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
  const format = `{{.ID}}\t{{.Names}}\t{{.Label "${LABEL_TASK_ID}"}}`;
  let outcome;
  try {
    outcome = await channel.run(
      ["container", "ls", "--all", "--no-trunc", ...filters, "--format", format],
      bound,
    );
  } catch (error) {
    throw new ListingError(
      target.kind === "ssh" ? "ssh" : "launch",
      { elapsed_ms: bound.elapsedMs(), detail: errorMessage(error) },
      errorMessage(error),
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
  return outcome.stdout
    .toString("utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => {
      const [id = "", name = "", taskId = ""] = line.split("\t");
      return { id, name, taskId };
    })
    .filter((c) => c.id !== "");
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
  const base = { container: container.name, task_id: container.taskId || null };
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
