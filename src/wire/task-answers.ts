import type { Task } from "../tasks/task.js";
import type { TaskStatus } from "../tasks/task-status.js";
import type { ImagePullProgress, PortMapping } from "../tasks/task-parts.js";
import type { TaskStatusChange } from "../tasks/task-store.js";

/** `GET /api/tasks/{id}` and the other task answers (dstack-shim's TaskInfoResponse). */
export interface TaskInfoResponse {
  id: string;
  status: TaskStatus;
  termination_reason: string;
  termination_message: string;
  ports: readonly PortMapping[] | null;
  image_pull_progress: ImagePullProgress | null;
  container_name: string;
  container_id: string;
  /** The key's spelling is dstack-shim's (sic). */
  gpus_ids: readonly string[] | null;
  /** taskshim extensions: the task's name and image, as submitted. */
  name: string;
  image_name: string;
  /** taskshim extension: the container's exit code; null until known, or when it never can be. */
  exit_code: number | null;
  /** taskshim extensions: ISO 8601 times; null when not reached yet or unknown. */
  created_at: string | null;
  started_at: string | null;
  finished_at: string | null;
}

const iso = (ms: number | undefined): string | null => (ms === undefined ? null : new Date(ms).toISOString());

/** The wire view of a task. */
export function taskInfo(task: Task): TaskInfoResponse {
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
  };
}

/** One line of `GET /api/events` (taskshim extension), as NDJSON. */
export interface TaskEvent {
  readonly time: string;
  /** `present`: in the snapshot that opens the stream; then `added`, `changed` or `removed`. */
  readonly kind: "present" | "added" | "changed" | "removed";
  readonly id: string;
  readonly from: TaskStatus | null;
  readonly to: TaskStatus | null;
  /** Set once the task is terminated. */
  readonly termination_reason?: string;
  readonly exit_code?: number | null;
}

/** A store change (or, with `present`, a task of the opening snapshot) as an event. */
export function taskEvent(
  change: TaskStatusChange | { readonly kind: "present"; readonly task: Task },
): TaskEvent {
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
