import pLimit from "p-limit";
import {
  ShimHttpError,
  UnaddressableTaskIdError,
  type ShimClient,
  type ShimTaskInfo,
} from "../control/shim-client.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { CliError } from "./client-common.js";

/** `--filter status=running` (repeatable; statuses of one filter are alternatives). */
export interface TaskFilter {
  readonly statuses: readonly TaskStatus[];
  readonly names: readonly string[];
}

/** Parses `--filter KEY=VALUE` entries: `status=<status>` and `name=<name>`. */
export function parseTaskFilters(entries: readonly string[]): TaskFilter {
  const statuses: TaskStatus[] = [];
  const names: string[] = [];
  for (const entry of entries) {
    const eq = entry.indexOf("=");
    const key = eq === -1 ? entry : entry.slice(0, eq);
    const value = eq === -1 ? "" : entry.slice(eq + 1);
    if (key === "status") {
      if (!(TASK_STATUSES as readonly string[]).includes(value)) {
        throw new CliError(
          `--filter status: expected one of ${TASK_STATUSES.join(", ")}, got ${JSON.stringify(value)}`,
        );
      }
      statuses.push(value as TaskStatus);
    } else if (key === "name" && value !== "") {
      names.push(value);
    } else {
      throw new CliError(`--filter: expected status=STATUS or name=NAME, got ${JSON.stringify(entry)}`);
    }
  }
  return { statuses, names };
}

/** Whether a task passes every filter key given (values of one key are alternatives). */
export function matchesFilter(task: ShimTaskInfo, filter: TaskFilter): boolean {
  return (
    (filter.statuses.length === 0 || filter.statuses.includes(task.status)) &&
    (filter.names.length === 0 || filter.names.includes(task.name ?? ""))
  );
}

/** Every task's full info; tasks removed between the list and the read are left out. */
export async function allTaskInfos(client: ShimClient, filter: (status: TaskStatus) => boolean = () => true) {
  const list = (await client.listTasks()).filter((t) => filter(t.status));
  const infos = await pLimit(8).map(list, async (t) => {
    try {
      return await client.getTask(t.id);
    } catch (error) {
      if (error instanceof ShimHttpError && error.status === 404) return undefined;
      // A listed id no request can name is shown as the list has it, never requested.
      if (error instanceof UnaddressableTaskIdError)
        return { id: t.id, status: t.status, termination_reason: "", termination_message: "" };
      throw error;
    }
  });
  return { list, infos: infos.filter((t): t is ShimTaskInfo => t !== undefined) };
}
