import type { Logger } from "pino";
import { isStorageError, type StorageHealth } from "../state/storage-health.js";
import { writeTaskState } from "../state/task-state-file.js";
import type { Task, TaskDraft } from "../tasks/task.js";
import type { TaskStore } from "../tasks/task-store.js";
import { failpoint } from "./failpoints.js";
import { errorMessage } from "../errors/error-message.js";

/** Writing a task's state file failed: the change it carried is not durable. */
export class TaskPersistError extends Error {
  override readonly name = "TaskPersistError";
}

/**
 * Writes task.json for a task, one write at a time per task. Each write snapshots the task
 * as stored *when it runs*, so a slow earlier write can never land after a newer one, and
 * requests that arrive while a write is already queued share it (it will carry their change).
 *
 * A write that fails leaves the task *not yet durable*: it is remembered (`unsynced`), a storage
 * error marks the home degraded, and `flush` writes those tasks again once the home takes writes.
 */
export class TaskPersister {
  private readonly chains = new Map<string, Promise<void>>();
  /** Per task, the write queued behind the one in flight and not started yet. */
  private readonly queued = new Map<string, Promise<void>>();
  /** Tasks whose last write failed: what memory says is not on disk yet. */
  private readonly unsynced = new Set<string>();

  constructor(
    private readonly store: TaskStore,
    private readonly bootId: string,
    private readonly log: Logger,
    private readonly health?: StorageHealth,
  ) {}

  /** Persists the task's current state; resolves once it is durable. A deleted task is skipped. */
  persist(id: string): Promise<void> {
    const waiting = this.queued.get(id);
    if (waiting) return waiting;
    const next = this.enqueue(id, async () => {
      this.queued.delete(id);
      const task = this.store.get(id);
      if (!task) {
        this.unsynced.delete(id);
        return;
      }
      await this.write(task);
    });
    this.queued.set(id, next);
    return next;
  }

  /**
   * Applies a change only once it is durable: the task as `fn` would make it is written first
   * (in this task's write order), and stored in memory only if the write succeeded. On a failure
   * nothing changed, in memory or on disk (a `TaskPersistError`).
   */
  persistChange(id: string, fn: (draft: TaskDraft) => void): Promise<Task> {
    let result: Task | undefined;
    // Later persists queue behind this change, so they carry it.
    this.queued.delete(id);
    const next = this.enqueue(id, async () => {
      const candidate = this.store.preview(id, fn);
      await this.write(candidate);
      // The same times as the written file (the store stamps a status change's time once).
      result = this.store.modify(id, (draft) => {
        fn(draft);
        if (candidate.startedAt !== undefined) draft.startedAt ??= candidate.startedAt;
        if (candidate.finishedAt !== undefined) draft.finishedAt ??= candidate.finishedAt;
      });
    });
    return next.then(() => result as Task);
  }

  /** Ids of the tasks whose last write failed (not yet durable). */
  unsyncedIds(): string[] {
    return [...this.unsynced].filter((id) => this.store.get(id) !== undefined);
  }

  /**
   * Writes every task that is not yet durable (storage came back). Resolves true when all of
   * them are on disk now.
   */
  async flush(): Promise<boolean> {
    const ids = [...this.unsynced];
    const results = await Promise.allSettled(ids.map((id) => this.persist(id)));
    return results.every((r) => r.status === "fulfilled");
  }

  /** Forgets a task that no longer exists (a failed submit): nothing of it is to be written. */
  forget(id: string): void {
    this.unsynced.delete(id);
  }

  /** Waits for every pending write of a task (before its dir is deleted). */
  async settle(id: string): Promise<void> {
    await this.chains.get(id)?.catch(() => undefined);
  }

  private enqueue(id: string, work: () => Promise<void>): Promise<void> {
    const previous = this.chains.get(id) ?? Promise.resolve();
    const next = previous.catch(() => undefined).then(work);
    this.chains.set(id, next);
    void next
      .finally(() => {
        if (this.chains.get(id) === next) this.chains.delete(id);
      })
      .catch(() => undefined);
    return next;
  }

  private async write(task: Task): Promise<void> {
    // A held task's file is never written: a newer release's, or evidence left for a human.
    if (task.taskDir === "" || task.held !== undefined) {
      this.unsynced.delete(task.id);
      return;
    }
    try {
      await failpoint("durable-write:task-state");
      await writeTaskState(task.taskDir, task, this.bootId);
      this.unsynced.delete(task.id);
    } catch (cause) {
      this.unsynced.add(task.id);
      if (isStorageError(cause)) this.health?.markFailed(cause);
      this.log.error({ taskId: task.id, err: cause }, "failed to persist task state");
      throw new TaskPersistError(`failed to persist state of task ${task.id}: ${errorMessage(cause)}`, {
        cause,
      });
    }
  }
}
