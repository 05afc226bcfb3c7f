import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";
import { isStorageError, StorageUnavailableError } from "../state/storage-health.js";
import type { Task, TaskDraft } from "../tasks/task.js";
import { failpoint } from "./failpoints.js";
import { deleteRegistryAuth } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import { TaskOperationError } from "./task-errors.js";
import { TaskPersistError, TaskPersister } from "./task-persister.js";

/** A change to a task, applied to its draft. */
export type TaskChange = (draft: TaskDraft) => void;

/** What a new task needs on disk besides its task.json (`TaskCommits.createDurably`). */
export interface NewTaskFiles {
  /** Writes the task's files (its dir, its credentials); returns the change that records them. */
  write(task: Task): Promise<TaskChange>;
  /** Deletes what `write` made, after a failure (which may have cut `write` part-way). */
  undo(): Promise<void>;
}

/**
 * The one writer of task state: every change to a stored task, and every write of its
 * task.json, goes through one of these modes (lint refuses `store.modify` and
 * `persister.persist`/`persistChange` anywhere else; the restore only adds the tasks it
 * rebuilds). They differ in which comes first, memory
 * or disk, and in what a storage error does:
 *
 * | mode                       | order                              | on a storage error              |
 * | -------------------------- | ---------------------------------- | ------------------------------- |
 * | `commit`                   | memory, then disk (awaited)        | kept in memory, not yet durable |
 * | `commitVisibleWhenDurable` | disk, then memory                  | kept in memory, not yet durable |
 * | `commitDurably`            | disk, then memory                  | nothing changed (HTTP 503)      |
 * | `commitInBackground`       | memory, then disk (not awaited)    | kept in memory, not yet durable |
 * | `inMemoryOnly`             | memory only                        | (nothing written)               |
 * | `markCleanedUp`            | memory only                        | (nothing written)               |
 * | `createDurably`            | memory, then disk (awaited)        | nothing kept (HTTP 503)         |
 * | `writeRestored`            | disk (memory already restored)     | kept in memory, not yet durable |
 * | `discard`                  | memory, then pending writes settle | (nothing written)               |
 *
 * Writes of one task are serialised by the persister and each writes the task as it is when the
 * write runs, so a later awaited write always carries every change made before it.
 */
export class TaskCommits {
  /** Writes task.json for this writer's modes (lint allows its writes nowhere else). */
  readonly persister: TaskPersister;

  constructor(private readonly ctx: RunnerContext) {
    this.persister = new TaskPersister(ctx.store, ctx.bootId, ctx.log, ctx.storage);
  }

  /**
   * Applies a change to a task and makes it durable before returning. For the shim's own steps
   * (start, reconciler, release): when the home cannot take the write (a storage error), the
   * change stays in memory, the task is left *not yet durable* and written once storage is back
   * (`catchUpStorage`); a restart before that re-derives it from the container, as after a kill.
   *
   * On a crash: memory changes first, so a crash before the write leaves task.json one change
   * behind what a read may have shown; only changes a restart re-derives (from the container, or
   * by running an idempotent step again) may be committed this way.
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
   *
   * On a crash: task.json has the change before any read can show it, so a restart never takes
   * back what a read said (unless storage was failing: then as `commit`).
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
   *
   * On a crash: task.json has the change before memory does; a crash before the write answers
   * nothing and changed nothing (the request is safe to retry).
   */
  async commitDurably(id: string, fn: TaskChange): Promise<Task> {
    try {
      return await this.persister.persistChange(id, fn);
    } catch (error) {
      const cause = storageCause(error);
      if (cause !== undefined) throw new StorageUnavailableError(cause);
      throw error;
    }
  }

  /**
   * Applies a change in memory at once and queues its write without waiting for it: the steps of
   * a start before `running` (`preparing`, `pulling`, `creating`), which only keep the status a
   * restart shows current. A failed write is not thrown: the persister logs it and remembers the
   * task as not yet durable (written by the task's next write, or once storage is back).
   *
   * On a crash: task.json may still say an earlier step; a restart resumes the start from there,
   * which is safe because every step is idempotent. The task's next awaited write (the `running`
   * commit) is queued behind this one and carries it.
   */
  commitInBackground(id: string, fn: TaskChange): Task {
    const task = this.ctx.store.modify(id, fn);
    this.persister.persist(id).catch(() => undefined);
    return task;
  }

  /**
   * Applies a change in memory only; nothing is written now, and the task's next write carries
   * it. For what a restart does not need: the pull's progress (a restart pulls again), and the
   * container id a start records before `running` (a restart finds the container by its name).
   *
   * On a crash: lost; only for what a restart re-derives or redoes.
   */
  inMemoryOnly(id: string, fn: TaskChange): Task {
    return this.ctx.store.modify(id, fn);
  }

  /**
   * Marks the task released (`cleanedUp`) in memory, before its release runs: the task's host
   * keys then leave the set the release reconciles. Nothing is written now; the release's last
   * commit (its GPU ids) carries it, so task.json says `cleaned_up` only once the release is done.
   *
   * On a crash: lost, so the restore runs the release again, and each of its steps is a no-op the
   * second time. Never written first: a crash mid-release would then leak what was not released.
   */
  markCleanedUp(id: string): Task {
    return this.ctx.store.modify(id, (d) => (d.cleanedUp = true));
  }

  /**
   * Submission: adds a new task (`pending`) and makes it durable before returning: `files.write`
   * makes what it needs on disk and returns the change recording it, then task.json is written.
   * The task is in the store from the call on, before anything is awaited, so a retried submit
   * arriving meanwhile finds it. On any failure nothing of it stays (it leaves memory, its pending
   * writes settle, `files.undo` deletes its files) and the error says why: storage (HTTP 503,
   * the home marked degraded; a probe decides when the failing call did not say so) or another
   * failure (`TaskOperationError`).
   *
   * On a crash: before task.json is written, a restart restores no task from the dir (the restore
   * deletes the credentials of a dir without a valid task.json, and sweeps an empty one); after,
   * the task is `pending` and its start resumes. The client had no answer either way.
   */
  async createDurably(task: Task, files: NewTaskFiles): Promise<void> {
    const { store } = this.ctx;
    store.add(task);
    try {
      const recordFiles = await files.write(task);
      store.modify(task.id, recordFiles);
      await this.persister.persist(task.id);
      await failpoint("after-state:pending");
    } catch (cause) {
      // Nothing of a failed submit may stay: not the task, not its dir, not its credentials.
      await this.discard(task.id);
      await files.undo();
      const failed = storageCause(cause) ?? (await this.storageFault());
      if (failed !== undefined) {
        this.ctx.storage?.markFailed(failed);
        throw new StorageUnavailableError(failed);
      }
      throw new TaskOperationError(`failed to create task ${task.id}: ${errorMessage(cause)}`, { cause });
    }
  }

  /**
   * Writes a task as the restore rebuilt it in memory (the restore reconciled it with its
   * container), and waits for the write. A failed write is not thrown: the task stays not yet
   * durable and is written once the home takes writes (a degraded home does not stop the start).
   *
   * On a crash: before the write, the next restore reconciles the task again the same way; after,
   * a container that vanishes meanwhile no longer sends the task back to an earlier status.
   */
  async writeRestored(id: string): Promise<void> {
    await this.persister.persist(id).catch(() => undefined);
  }

  /**
   * Removes a task from memory and waits for its pending writes, so none lands after its dir is
   * deleted (a failed submit, a remove). Nothing of it is to be written any more.
   */
  async discard(id: string): Promise<void> {
    this.ctx.store.delete(id);
    await this.persister.settle(id);
    // Stryker disable next-line CallExpression: only frees the entry; a deleted task's unsynced id is skipped by persist and filtered out of unsyncedIds
    this.persister.forget(id);
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

  /**
   * Whether the home's storage is what failed: some calls report a storage fault as something
   * else (a recursive mkdir on a read-only file system answers ENOENT), so a probe decides.
   */
  private async storageFault(): Promise<Error | undefined> {
    const failed = await this.ctx.storage?.probe();
    return isStorageError(failed) ? failed : undefined;
  }
}

/**
 * The storage error a failure comes down to (a failed task.json write's cause, or the error
 * itself), or undefined when storage is not what failed.
 */
function storageCause(error: unknown): unknown {
  const cause = error instanceof TaskPersistError ? error.cause : error;
  return isStorageError(cause) ? cause : undefined;
}

function warnNotDurable(log: Logger, task: Task): void {
  log.warn(
    { taskId: task.id, status: task.status },
    "task state not yet durable; written when storage is back",
  );
}
