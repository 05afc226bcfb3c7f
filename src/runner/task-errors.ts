/*
 * The errors a request to the lifecycle engine answers with; the HTTP edge maps each to a status.
 */

/** A submit reused an id with a different config. */
export class TaskConflictError extends Error {
  override readonly name = "TaskConflictError";
}
/** The operation is not allowed in the task's current status (HTTP 409). */
export class TaskStateError extends Error {
  override readonly name = "TaskStateError";
}
/** A Docker or host operation failed while serving a request (HTTP 500). */
export class TaskOperationError extends Error {
  override readonly name = "TaskOperationError";
}
