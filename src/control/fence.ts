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
import { isValidTaskId } from "../tasks/task-config.js";
import { ShimClient, ShimHttpError, ShimUnreachableError } from "./shim-client.js";
import { errorMessage } from "../errors/error-message.js";

/** `--deadline`'s default: the seed's removal deadline. */
export const FENCE_DEFAULT_DEADLINE_MS = 30_000;
/** Removals run at once on one host. */
const FENCE_CONCURRENCY = 4;
/** The `service` every dstack-shim (and so every taskshim) names in its healthcheck. */
const SHIM_SERVICE = "dstack-shim";
/** A container id as `docker container ls --no-trunc` prints it. */
const CONTAINER_ID = /^[0-9a-f]{64}$/;

/** Which of a host's task containers to fence. */
export type FenceSelection =
  { readonly kind: "all" } | { readonly kind: "tasks"; readonly ids: readonly string[] };

/** How one task container ended. */
export type FenceOutcome = "removed" | "already_absent" | "unconfirmed";

/** Which path had the last word: the shim's API, or the docker CLI over SSH or locally. */
export type FenceVia = "api" | "ssh" | "local";

/** One container (or one requested task) of a fence. */
export interface FenceResult {
  /** The container's name; null when no container was found (or the host could not be listed). */
  readonly container: string | null;
  readonly task_id: string | null;
  readonly outcome: FenceOutcome;
  /** Why it is unconfirmed (`deadline`, `ssh`, `exit`, `unknown_to_shim`…); null when confirmed. */
  readonly reason: string | null;
  /** The path that decided this result (a host's results may come from both). */
  readonly via: FenceVia;
  readonly evidence: Readonly<Record<string, unknown>>;
}

/**
 * Why the host as a whole is not confirmed, apart from any one result: it could not be listed
 * (`ssh`, `deadline`, `exit`, `listing`…), the peer is no shim (`not_a_shim`), the shim did not
 * answer (`shim_unreachable`) or refused its list (`shim`), or `--all` went through a shim only,
 * which cannot see containers it does not know (`engine_not_listed`).
 */
export interface FenceHostError {
  readonly reason: string;
  /** One line, as the table prints it. */
  readonly detail: string;
  readonly evidence: Readonly<Record<string, unknown>>;
}

/** What `taskshim fence --json` prints. */
export interface FenceReport {
  /** The docker CLI's target when it was used, else the shim's `host:port`. */
  readonly host: string;
  /** `ssh` or `local` when the engine was listed (or tried), `api` when only the shim was asked. */
  readonly via: FenceVia;
  /** True only when the host could be seen whole and every result is confirmed. */
  readonly confirmed: boolean;
  /** The host-level failure; null when there is none (then `confirmed` is up to the results). */
  readonly error: FenceHostError | null;
  readonly results: readonly FenceResult[];
}

/** A fence request, parsed from the command line. */
export interface FenceRequest {
  /** Ask this shim first (`--shim`). */
  readonly shimUrl?: string;
  /** Bearer token for the shim. */
  readonly authToken?: string;
  /** Where the docker CLI runs (`--ssh` or `--local`), alone or to check what the shim did not confirm. */
  readonly cli?: CliTarget;
  readonly selection: FenceSelection;
  /** Bounds each removal, each listing and each shim call. */
  readonly deadlineMs: number;
  /** Extra `KEY=VALUE` labels a container must carry too (narrows, never widens). */
  readonly labels?: readonly string[];
}

/** A request `fence` cannot act on (no target, a task id no shim would accept); nothing was done. */
export class FenceRequestError extends Error {
  override readonly name = "FenceRequestError";
}

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

function report(
  host: string,
  via: FenceVia,
  results: readonly FenceResult[],
  error: FenceHostError | null,
): FenceReport {
  return {
    host,
    via,
    confirmed: error === null && results.every((r) => r.outcome !== "unconfirmed"),
    error,
    results,
  };
}

/** One unconfirmed row per requested task of a host that could not be seen. */
function unseen(ids: readonly string[], via: FenceVia, error: FenceHostError): FenceResult[] {
  return ids.map((id) => ({
    container: null,
    task_id: id,
    outcome: "unconfirmed",
    reason: error.reason,
    via,
    evidence: { ...error.evidence, detail: error.detail },
  }));
}

/**
 * Fences a host: makes sure its task containers are dead before a control plane runs the tasks
 * elsewhere. `--shim` first (healthcheck, then terminate with timeout 0, remove, confirm through
 * the API). Only a removal the shim performed and confirmed counts: a 404 proves only that *this*
 * shim does not know the task (a wiped or replaced home), so every task the API did not confirm —
 * and, for `--all`, the whole engine — goes to the docker CLI when a target is given (over SSH, or
 * locally: list the containers carrying the task label, remove each with the confirmed removal),
 * and is reported unconfirmed, with its reason, when none is.
 */
export async function fence(commands: CommandRunner, request: FenceRequest): Promise<FenceReport> {
  if (request.selection.kind === "tasks") {
    // A task id goes into the shim's URLs: `..` would name another route.
    const invalid = request.selection.ids.find((id) => !isValidTaskId(id));
    if (invalid !== undefined) throw new FenceRequestError(`invalid task id ${JSON.stringify(invalid)}`);
  }
  if (request.shimUrl === undefined && request.cli === undefined) {
    throw new FenceRequestError("fence needs --shim, --ssh or --local");
  }
  const api = request.shimUrl === undefined ? undefined : await fenceViaShim(request.shimUrl, request);
  // The engine is asked unless the API confirmed every requested task (`--all` always asks it:
  // a shim cannot list what it does not know).
  const settledByApi = api !== undefined && request.selection.kind === "tasks" && api.pending.length === 0;
  if (request.cli !== undefined && !settledByApi) return fenceViaCli(commands, request.cli, request, api);
  // Only the API was asked (the guard above makes `api` defined here).
  const pass = api as ApiPass;
  const error =
    pass.failure ??
    (request.selection.kind === "all"
      ? {
          reason: "engine_not_listed",
          detail:
            "a shim lists only the tasks it knows (not those of a wiped or replaced home): " +
            "give --ssh or --local to list the engine's task containers",
          evidence: {},
        }
      : null);
  return report(pass.host, "api", [...pass.confirmed, ...pass.pending], error);
}

// --- the shim's API --------------------------------------------------------------------------

/** What the API alone established. */
interface ApiPass {
  readonly host: string;
  /** Why the API could not be used at all (no shim, no answer, no list); null when it could. */
  readonly failure: FenceHostError | null;
  /** Removed by the shim and confirmed by its 404 afterwards. */
  readonly confirmed: FenceResult[];
  /** Everything else, unconfirmed with the API's reason: for the docker CLI to settle, or to report. */
  readonly pending: FenceResult[];
}

/** The failure of an API call as a reason: no answer, or an answer that is not the one needed. */
function apiReason(error: unknown): string {
  return error instanceof ShimUnreachableError ? "shim_unreachable" : "shim";
}

async function fenceViaShim(url: string, request: FenceRequest): Promise<ApiPass> {
  const client = new ShimClient(
    url,
    request.deadlineMs,
    request.authToken === undefined ? {} : { authToken: request.authToken },
  );
  const host = new URL(url).host;
  const started = performance.now();
  const requested = request.selection.kind === "tasks" ? request.selection.ids : [];
  const failed = (reason: string, detail: string): ApiPass => {
    const failure = { reason, detail, evidence: { elapsed_ms: Math.round(performance.now() - started) } };
    return { host, failure, confirmed: [], pending: unseen(requested, "api", failure) };
  };
  // Anything that answers HTTP can answer 404 or `{"tasks":[]}`: only a shim's word counts.
  try {
    const health = await client.healthcheck();
    if (health.service !== SHIM_SERVICE) {
      return failed(
        "not_a_shim",
        `${url} is not a shim: its healthcheck names service ${JSON.stringify(health.service)}`,
      );
    }
    // A shim on an engine that is not its home's cannot see the tasks' containers: its word on
    // them proves nothing.
    if (health.engine?.status === "mismatch") {
      return failed(
        "engine_mismatch",
        `${url} is not on its home's engine: ${health.engine.error ?? "mismatch"}`,
      );
    }
  } catch (error) {
    if (error instanceof ShimUnreachableError) return failed("shim_unreachable", errorMessage(error));
    return failed("not_a_shim", `${url} is not a shim: ${errorMessage(error)}`);
  }
  let ids: readonly string[] = requested;
  if (request.selection.kind === "all") {
    try {
      ids = (await client.listTasks()).map((t) => t.id);
    } catch (error) {
      return failed(apiReason(error), `cannot list the tasks of ${url}: ${errorMessage(error)}`);
    }
  }
  const limit = pLimit(FENCE_CONCURRENCY);
  const results = await Promise.all(ids.map((id) => limit(() => fenceTaskViaShim(client, id))));
  return {
    host,
    failure: null,
    confirmed: results.filter((r) => r.outcome !== "unconfirmed"),
    pending: results.filter((r) => r.outcome === "unconfirmed"),
  };
}

/**
 * Terminate (timeout 0), remove, then confirm that the shim no longer knows the task. Confirmed
 * only when all three happened; a 404 at the first step is `unknown_to_shim`, never "absent".
 */
async function fenceTaskViaShim(client: ShimClient, id: string): Promise<FenceResult> {
  const started = performance.now();
  const steps: string[] = [];
  let container: string | null = null;
  const result = (outcome: FenceOutcome, reason: string | null, detail?: string): FenceResult => ({
    container,
    task_id: id,
    outcome,
    reason,
    via: "api",
    evidence: {
      elapsed_ms: Math.round(performance.now() - started),
      steps,
      ...(detail === undefined ? {} : { detail }),
    },
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
      return result(
        "unconfirmed",
        "unknown_to_shim",
        "the shim does not know this task (404), which proves nothing about the engine's containers " +
          "(a wiped or replaced home): give --ssh or --local to check the engine",
      );
    }
    return result("unconfirmed", apiReason(error), errorMessage(error));
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
    return result("unconfirmed", apiReason(error), errorMessage(error));
  }
}

// --- the docker CLI, over SSH or locally -----------------------------------------------------

/** The API's reason for a task it left unconfirmed, kept in the CLI result's evidence. */
function shimNote(result: FenceResult | undefined): Record<string, unknown> {
  if (result === undefined) return {};
  const detail = typeof result.evidence.detail === "string" ? `: ${result.evidence.detail}` : "";
  return { shim: `${result.reason ?? "unconfirmed"}${detail}` };
}

async function fenceViaCli(
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
