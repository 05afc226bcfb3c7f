import type { Task } from "../tasks/task.js";
import type { TaskStatus } from "../tasks/task-status.js";
import type { ImagePullProgress } from "../docker/pull-progress.js";
import type { PortMapping } from "../tasks/task.js";

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
}

/** The wire view of a task. */
export function taskInfo(task: Task): TaskInfoResponse {
  return {
    id: task.id,
    status: task.status,
    termination_reason: task.terminationReason,
    termination_message: task.terminationMessage,
    ports: task.ports,
    image_pull_progress: task.pullProgress,
    container_name: task.containerName,
    container_id: task.containerId,
    gpus_ids: task.status === "pending" ? null : task.gpuIds,
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
