import pLimit from "p-limit";
import { errorMessage } from "../errors/error-message.js";
import {
  FENCE_CONCURRENCY,
  unseen,
  type FenceHostError,
  type FenceOutcome,
  type FenceRequest,
  type FenceResult,
} from "./fence-report.js";
import { ShimClient, ShimHttpError, ShimUnreachableError } from "./shim-client.js";

/*
 * The fence through a shim's HTTP API: healthcheck, then terminate with timeout 0, remove and
 * confirm each task. Only a removal the shim performed and confirmed counts; everything else is
 * left pending, with the API's reason, for the docker CLI (fence-cli.ts) to settle or to report.
 */

/** The `service` every dstack-shim (and so every taskshim) names in its healthcheck. */
const SHIM_SERVICE = "dstack-shim";

/** What the API alone established. */
export interface ApiPass {
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

/** Asks the shim at `url` to remove the selected tasks, and what it confirmed. */
export async function fenceViaShim(url: string, request: FenceRequest): Promise<ApiPass> {
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
