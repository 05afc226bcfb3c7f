import type { Task, TaskDraft } from "./task.js";
import { TaskLock, type Unlock } from "./task-lock.js";
import { orderedTimes } from "./task-times.js";
import { isTransitionAllowed, TransitionNotAllowedError } from "./task-status.js";

/** The task id is not in the store. */
export class TaskNotFoundError extends Error {
  override readonly name = "TaskNotFoundError";
  constructor(readonly taskId: string) {
    super(`task ${taskId}: not found`);
  }
}

/** A task with this id is already stored. */
export class TaskExistsError extends Error {
  override readonly name = "TaskExistsError";
  constructor(readonly taskId: string) {
    super(`task ${taskId} is already submitted`);
  }
}

/** A task appeared, changed status, or was removed: what `GET /api/events` streams. */
export type TaskStatusChange =
  | { readonly kind: "added"; readonly task: Task }
  | { readonly kind: "changed"; readonly task: Task; readonly from: Task["status"] }
  | { readonly kind: "removed"; readonly task: Task };

/**
 * The in-memory tasks, with copy-on-write updates and a per-task lock.
 *
 * Reads return frozen snapshots, so a caller never sees a half-applied change. The lock is a
 * real mutex: API operations wait (`lock`), the reconciler skips a busy task (`tryLock`).
 */
export class TaskStore {
  private readonly tasks = new Map<string, Task>();
  private readonly locks = new Map<string, TaskLock>();
  private changes = 0;
  private readonly watchers = new Set<(change: TaskStatusChange) => void>();

  /**
   * Calls `fn` synchronously on every status change, addition and removal, in order, so a
   * follower sees every status a task passes through. Returns the unsubscribe function.
   * `fn` must not throw or modify the store.
   */
  watch(fn: (change: TaskStatusChange) => void): () => void {
    this.watchers.add(fn);
    return () => this.watchers.delete(fn);
  }

  private notify(change: TaskStatusChange): void {
    for (const fn of this.watchers) fn(change);
  }

  /** Grows with every add, modify and delete: equal values mean the same tasks (for caches). */
  get generation(): number {
    return this.changes;
  }

  /**
   * Adds a new task, its times in order (`orderedTimes`: a restore's come from task.json and the
   * container); throws `TaskExistsError` if the id is taken.
   */
  add(task: Task): Task {
    if (this.tasks.has(task.id)) throw new TaskExistsError(task.id);
    const frozen = Object.freeze(orderedTimes({ ...task }));
    this.tasks.set(task.id, frozen);
    this.changes++;
    this.notify({ kind: "added", task: frozen });
    return frozen;
  }

  /** The current snapshot, or undefined. */
  get(id: string): Task | undefined {
    return this.tasks.get(id);
  }

  /** The current snapshot, or `TaskNotFoundError`. */
  mustGet(id: string): Task {
    const task = this.tasks.get(id);
    if (!task) throw new TaskNotFoundError(id);
    return task;
  }

  /** Every task, in insertion order. */
  list(): Task[] {
    return [...this.tasks.values()];
  }

  /** Number of tasks. */
  get size(): number {
    return this.tasks.size;
  }

  /**
   * Applies `fn` to a copy and stores it. The transition is checked only if the status
   * changes; once a terminated task has a reason, later reasons and messages are ignored
   * (the server terminates every task, even finished ones, and the first reason is the truth);
   * the times are put in order (`orderedTimes`), whoever set them.
   * `fn` must be synchronous and fast: no I/O.
   */
  modify(id: string, fn: (draft: TaskDraft) => void): Task {
    const current = this.mustGet(id);
    const next = this.preview(id, fn);
    this.tasks.set(id, next);
    this.changes++;
    if (next.status !== current.status) this.notify({ kind: "changed", task: next, from: current.status });
    return next;
  }

  /**
   * The task `modify` would store, without storing it: a change that must be durable before it
   * is visible is written from this, and applied only once the write succeeded.
   */
  preview(id: string, fn: (draft: TaskDraft) => void): Task {
    const current = this.mustGet(id);
    const draft: TaskDraft = { ...current };
    fn(draft);
    if (draft.id !== current.id) throw new Error("modify must not change a task's id");
    if (draft.status !== current.status && !isTransitionAllowed(current.status, draft.status)) {
      throw new TransitionNotAllowedError(current.status, draft.status);
    }
    // The times of a status change are stamped here, once, unless the change brings its own (the
    // container's start or finish), and every task stored is in time order: this is the one
    // place every change goes through (`modify`, and `preview` for a change written first).
    if (draft.status !== current.status) {
      if (draft.status === "running") draft.startedAt ??= Date.now();
      if (draft.status === "terminated") draft.finishedAt ??= Date.now();
    }
    // The first reason wins: a terminated task's, or a terminate's intent on a task still
    // running (its container stopping), which the exit the stop causes must not replace.
    if (current.terminationReason !== "") {
      draft.terminationReason = current.terminationReason;
      draft.terminationMessage = current.terminationMessage;
    }
    return Object.freeze(orderedTimes(draft));
  }

  /** Removes a task and its lock. */
  delete(id: string): void {
    const task = this.tasks.get(id);
    if (task && this.tasks.delete(id)) {
      this.changes++;
      this.notify({ kind: "removed", task });
    }
    this.locks.delete(id);
  }

  private lockOf(id: string): TaskLock {
    let lock = this.locks.get(id);
    if (!lock) {
      lock = new TaskLock();
      this.locks.set(id, lock);
    }
    return lock;
  }

  /** Waits for the task's lock. Contention is normal (the reconciler holds it briefly). */
  lock(id: string): Promise<Unlock> {
    return this.lockOf(id).lock();
  }

  /** Takes the task's lock if it is free, else returns undefined at once. */
  tryLock(id: string): Unlock | undefined {
    return this.lockOf(id).tryLock();
  }

  /** Runs `fn` holding the task's lock. */
  async withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const unlock = await this.lock(id);
    try {
      return await fn();
    } finally {
      unlock();
    }
  }
}
