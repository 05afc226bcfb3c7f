import { heldMessage, type Task } from "../tasks/task.js";
import type { TaskStatusChange } from "../tasks/task-store.js";
import type { TaskEventAnswer, TaskInfoAnswer } from "./schemas.js";

/*
 * The server's answers about tasks, built from the task model: their shapes are the wire
 * schemas' (schemas.ts), so a field the schema gains and the answer lacks fails to compile.
 */

const iso = (ms: number | undefined): string | null => (ms === undefined ? null : new Date(ms).toISOString());

/** The wire view of a task. */
export function taskInfo(task: Task): TaskInfoAnswer {
  return {
    id: task.id,
    status: task.status,
    // A terminate's intent on a task still running (its container stopping) is not shown yet.
    termination_reason: task.status === "terminated" ? task.terminationReason : "",
    termination_message: task.status === "terminated" ? task.terminationMessage : "",
    ports: task.ports ?? null,
    image_pull_progress: task.pullProgress ?? null,
    container_name: task.containerName,
    container_id: task.containerId ?? "",
    gpus_ids: task.status === "pending" ? null : task.gpuIds,
    name: task.config.name,
    image_name: task.config.image_name,
    exit_code: task.exitCode ?? null,
    created_at: iso(task.createdAt),
    started_at: iso(task.startedAt),
    finished_at: iso(task.finishedAt),
    ...(task.held !== undefined
      ? {
          held: {
            kind: task.held.kind,
            message: heldMessage(task.id, task.held),
            ...(task.held.kind !== "unquarantined" && task.held.status !== undefined
              ? { status: task.held.status }
              : {}),
          },
        }
      : {}),
  };
}

/** A store change (or, with `present`, a task of the opening snapshot) as an event. */
export function taskEvent(
  change: TaskStatusChange | { readonly kind: "present"; readonly task: Task },
): TaskEventAnswer {
  const { task } = change;
  const terminated =
    change.kind !== "removed" && task.status === "terminated"
      ? { termination_reason: task.terminationReason, exit_code: task.exitCode ?? null }
      : {};
  return {
    time: new Date().toISOString(),
    kind: change.kind,
    id: task.id,
    from: change.kind === "changed" ? change.from : change.kind === "removed" ? task.status : null,
    to: change.kind === "removed" ? null : task.status,
    ...terminated,
  };
}

const infoBodies = new WeakMap<Task, string>();

/**
 * `taskInfo` as JSON text. Snapshots are immutable, so each is serialized once however often
 * a control plane polls it (the hot path of the API).
 */
export function taskInfoJson(task: Task): string {
  let body = infoBodies.get(task);
  if (body === undefined) {
    body = JSON.stringify(taskInfo(task));
    infoBodies.set(task, body);
  }
  return body;
}
