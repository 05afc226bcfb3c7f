import {
  ShimHttpError,
  UnaddressableTaskIdError,
  type ShimClient,
  type ShimTaskInfo,
} from "../control/shim-client.js";
import pLimit from "p-limit";

/** The id given on the command line matches no task, or more than one. */
export class TaskLookupError extends Error {
  override readonly name = "TaskLookupError";
}

/** The most candidates an ambiguity error lists before `…`. */
const MAX_CANDIDATES = 5;

/**
 * Finds the one task an operator means, as docker finds a container: the exact id, else the
 * exact task name, else a unique id prefix. An ambiguous name or prefix is an error listing the
 * candidates; nothing found is an error naming what was given.
 */
export async function resolveTask(
  client: Pick<ShimClient, "listTasks" | "getTask">,
  given: string,
): Promise<ShimTaskInfo> {
  if (given === "") throw new TaskLookupError("a task id is empty");
  const list = await client.listTasks();
  const read = async (id: string): Promise<ShimTaskInfo | undefined> => {
    try {
      return await client.getTask(id);
    } catch (error) {
      // Removed between the list and the read; or an id no request can name (`..`).
      if (error instanceof ShimHttpError && error.status === 404) return undefined;
      if (error instanceof UnaddressableTaskIdError) return undefined;
      throw error;
    }
  };
  if (list.some((t) => t.id === given)) {
    const exact = await read(given);
    if (exact) return exact;
  }
  // Names are in the task info only (the list has ids and statuses): read them all.
  const infos = (await pLimit(8).map(list, (t) => read(t.id))).filter(
    (t): t is ShimTaskInfo => t !== undefined,
  );
  const named = infos.filter((t) => t.name === given);
  if (named.length === 1 && named[0]) return named[0];
  if (named.length > 1) throw ambiguous(given, "name", named);
  const prefixed = infos.filter((t) => t.id.startsWith(given));
  if (prefixed.length === 1 && prefixed[0]) return prefixed[0];
  if (prefixed.length > 1) throw ambiguous(given, "id prefix", prefixed);
  return Promise.reject(new TaskLookupError(`no such task: ${given} (see taskshim tasks ls)`));
}

function ambiguous(given: string, what: string, candidates: readonly ShimTaskInfo[]): TaskLookupError {
  const shown = candidates
    .slice(0, MAX_CANDIDATES)
    .map((t) => `${t.id}${t.name ? ` (${t.name})` : ""}`)
    .join(", ");
  const more = candidates.length > MAX_CANDIDATES ? `, … ${candidates.length - MAX_CANDIDATES} more` : "";
  return new TaskLookupError(
    `${what} ${given} matches ${candidates.length} tasks: ${shown}${more}; give more of the id`,
  );
}
