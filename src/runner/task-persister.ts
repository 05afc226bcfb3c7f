import type { Logger } from "pino";
import { writeTaskState } from "../state/task-state-file.js";
import type { TaskStore } from "../tasks/task-store.js";

/** Writing a task's state file failed: the change it carried is not durable. */
export class TaskPersistError extends Error {
  override readonly name = "TaskPersistError";
}

/**
 * Writes task.json for a task, one write at a time per task. Each write snapshots the task
 * as stored *when it runs*, so a slow earlier write can never land after a newer one, and
 * requests that arrive while a write is already queued share it (it will carry their change).
 */
export class TaskPersister {
  private readonly chains = new Map<string, Promise<void>>();
  /** Per task, the write queued behind the one in flight and not started yet. */
  private readonly queued = new Map<string, Promise<void>>();

  constructor(
    private readonly store: TaskStore,
    private readonly bootId: string,
    private readonly log: Logger,
  ) {}

  /** Persists the task's current state; resolves once it is durable. A deleted task is skipped. */
  persist(id: string): Promise<void> {
    const waiting = this.queued.get(id);
    if (waiting) return waiting;
    const previous = this.chains.get(id) ?? Promise.resolve();
    const next = previous
      .catch(() => undefined)
      .then(async () => {
        this.queued.delete(id);
        const task = this.store.get(id);
        if (!task || task.taskDir === "" || task.foreign) return;
        try {
          await writeTaskState(task.taskDir, task, this.bootId);
        } catch (cause) {
          this.log.error({ taskId: id, err: cause }, "failed to persist task state");
          throw new TaskPersistError(`failed to persist state of task ${id}: ${(cause as Error).message}`, {
            cause,
          });
        }
      });
    this.chains.set(id, next);
    this.queued.set(id, next);
    void next
      .finally(() => {
        if (this.chains.get(id) === next) this.chains.delete(id);
      })
      .catch(() => undefined);
    return next;
  }

  /** Waits for every pending write of a task (before its dir is deleted). */
  async settle(id: string): Promise<void> {
    await this.chains.get(id)?.catch(() => undefined);
  }
}
