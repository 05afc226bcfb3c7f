import type { CommandRunner } from "../exec/run-bounded.js";
import { isValidTaskId } from "../tasks/task-config.js";
import { fenceViaShim, type ApiPass } from "./fence-api.js";
import { fenceViaCli } from "./fence-cli.js";
import { report, type FenceReport, type FenceRequest } from "./fence-report.js";

// The fence's one face: its callers import the request and the report from here, the listing's
// parser too (the command's tests feed it hostile labels).
export type {
  FenceHostError,
  FenceOutcome,
  FenceReport,
  FenceRequest,
  FenceResult,
  FenceSelection,
  FenceVia,
} from "./fence-report.js";
export { ListingError, parseContainerListing } from "./fence-cli.js";

/** `--deadline`'s default: the seed's removal deadline. */
export const FENCE_DEFAULT_DEADLINE_MS = 30_000;

/** A request `fence` cannot act on (no target, a task id no shim would accept); nothing was done. */
export class FenceRequestError extends Error {
  override readonly name = "FenceRequestError";
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
