/** The six task statuses of the dstack-shim wire contract. */
export const TASK_STATUSES = [
  "pending",
  "preparing",
  "pulling",
  "creating",
  "running",
  "terminated",
] as const;

/** A task status as it appears on the wire and in memory. */
export type TaskStatus = (typeof TASK_STATUSES)[number];

const ALLOWED_FROM: Readonly<Record<TaskStatus, readonly TaskStatus[]>> = {
  // pending is the initial status only; nothing moves back to it.
  pending: [],
  preparing: ["pending"],
  pulling: ["preparing"],
  creating: ["pulling"],
  // Landed upstream (#4203): running only from creating; a same-status commit is not a transition.
  running: ["creating"],
  terminated: ["pending", "preparing", "pulling", "creating", "running", "terminated"],
};

/** Whether a task may move from `from` to `to` (only checked when the status changes). */
export function isTransitionAllowed(from: TaskStatus, to: TaskStatus): boolean {
  return ALLOWED_FROM[to].includes(from);
}

/** Thrown when a commit would make a forbidden status change. */
export class TransitionNotAllowedError extends Error {
  override readonly name = "TransitionNotAllowedError";
  constructor(
    readonly from: TaskStatus,
    readonly to: TaskStatus,
  ) {
    super(`${from} -> ${to} transition not allowed`);
  }
}
