import type { Logger } from "pino";
import { isStorageError, StorageUnavailableError } from "../state/storage-health.js";
import type { Task, TaskDraft } from "../tasks/task.js";
import { failpoint } from "./failpoints.js";
import { deleteRegistryAuth } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import { TaskPersistError, TaskPersister } from "./task-persister.js";

/** A change to a task, applied to its draft. */
export type TaskChange = (draft: TaskDraft) => void;

/**
 * The commit rules: how a change to a task becomes durable, for the shim's own steps (`commit`,
 * `commitVisibleWhenDurable`: a storage error leaves the change in memory, *not yet durable*) and
 * for what a request asks (`commitDurably`: nothing changes unless it is durable).
 */
export class TaskCommits {
  readonly persister: TaskPersister;

  constructor(private readonly ctx: RunnerContext) {
    this.persister = new TaskPersister(ctx.store, ctx.bootId, ctx.log, ctx.storage);
  }

  /**
   * Applies a change to a task and makes it durable before returning. For the shim's own steps
   * (start, reconciler, release): when the home cannot take the write (a storage error), the
   * change stays in memory, the task is left *not yet durable* and written once storage is back
   * (`catchUpStorage`); a restart before that re-derives it from the container, as after a kill.
   */
  async commit(id: string, fn: TaskChange): Promise<Task> {
    const before = this.ctx.store.mustGet(id).status;
    const task = this.ctx.store.modify(id, fn);
    try {
      await this.persister.persist(id);
    } catch (error) {
      if (!(error instanceof TaskPersistError && isStorageError(error.cause))) throw error;
      warnNotDurable(this.ctx.log, task);
    }
    if (task.status !== before) await failpoint(`after-state:${task.status}`);
    return task;
  }

  /**
   * A commit visible only once durable, so a read never shows a status that task.json lacks:
   * `running` (the start's last step). When the home cannot take the write (a storage error),
   * the change is made in memory at once all the same and written once storage is back, as
   * `commit` does.
   */
  async commitVisibleWhenDurable(id: string, fn: TaskChange): Promise<Task> {
    const before = this.ctx.store.mustGet(id).status;
    let task: Task;
    try {
      task = await this.persister.persistChange(id, fn);
    } catch (error) {
      if (!(error instanceof TaskPersistError && isStorageError(error.cause))) throw error;
      task = this.ctx.store.modify(id, fn);
      warnNotDurable(this.ctx.log, task);
    }
    if (task.status !== before) await failpoint(`after-state:${task.status}`);
    return task;
  }

  /**
   * Applies a change that a request asked for only once it is durable: on a failure nothing
   * changed, in memory or on disk, and the error says whether storage was the cause (HTTP 503).
   */
  async commitDurably(id: string, fn: TaskChange): Promise<Task> {
    try {
      return await this.persister.persistChange(id, fn);
    } catch (error) {
      const cause = error instanceof TaskPersistError ? error.cause : error;
      if (isStorageError(cause)) throw new StorageUnavailableError(cause);
      throw error;
    }
  }

  /**
   * Storage is back: writes every task that is not yet durable, and deletes the registry
   * credentials that a release or a start could not delete meanwhile. True when all is written.
   */
  async catchUpStorage(): Promise<boolean> {
    const written = await this.persister.flush();
    await Promise.all(
      this.ctx.store
        .list()
        .filter(
          // Stryker disable next-line ConditionalExpression,StringLiteral: the taskDir check only spares a call: deleteRegistryAuth("") returns at once
          (t) =>
            t.taskDir !== "" && t.held === undefined && (t.status === "running" || t.status === "terminated"),
        )
        .map((t) => deleteRegistryAuth(t.taskDir)),
    );
    return written;
  }
}

function warnNotDurable(log: Logger, task: Task): void {
  log.warn(
    { taskId: task.id, status: task.status },
    "task state not yet durable; written when storage is back",
  );
}
