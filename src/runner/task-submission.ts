import { existsSync } from "node:fs";
import { unlink } from "node:fs/promises";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import { isStorageError, StorageUnavailableError } from "../state/storage-health.js";
import { encodedTaskStateBytes, TASK_STATE_SUBMIT_MAX_BYTES } from "../state/task-state-file.js";
import { heldMessage, newTask, type Task } from "../tasks/task.js";
import {
  InvalidTaskConfigError,
  sameTaskConfig,
  type RegistryAuth,
  type TaskConfig,
} from "../tasks/task-config.js";
import { failpoint } from "./failpoints.js";
import { deleteRegistryAuth, REGISTRY_AUTH_FILE, writeRegistryAuth } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import type { TaskCommits } from "./task-commits.js";
import { TaskConflictError, TaskOperationError, TaskStateError } from "./task-errors.js";
import { TaskPersistError } from "./task-persister.js";

/**
 * Submission: a new task made durable (its dir, its registry credentials, its task.json) before
 * the answer, or nothing of it kept; a retried submit answered with the task it made.
 */
export class TaskSubmissions {
  /** Submits whose durable writes are in flight, by task id: a retry waits for them. */
  private readonly submits = new Map<string, Promise<void>>();

  constructor(
    private readonly ctx: RunnerContext,
    private readonly commits: TaskCommits,
    /** Starts the submitted task in the background. */
    private readonly startInBackground: (id: string) => void,
  ) {}

  /**
   * Adds a task, persists it (so a 200 answer is durable), and starts it in the background.
   * The same id with the same config returns the existing task (a retried submit whose answer
   * was lost); a different config under that id is a conflict.
   */
  async submit(config: TaskConfig, auth: RegistryAuth): Promise<Task> {
    const existing = this.ctx.store.get(config.id);
    if (existing) {
      // Never answered as the same task, never written over: a newer release's, or evidence.
      if (existing.held) throw new TaskStateError(heldMessage(config.id, existing.held));
      if (!sameTaskConfig(existing.config, config)) {
        throw new TaskConflictError(`task ${config.id} is already submitted with a different config`);
      }
      await this.submits.get(config.id);
      return this.ctx.store.mustGet(config.id);
    }
    this.refuseUnwritable(newTask(config));
    const { containerName } = this.ctx.store.add(newTask(config));
    const persisted = this.makeDurable(config, auth, containerName);
    this.submits.set(config.id, persisted);
    try {
      await persisted;
      // Stryker disable next-line BlockStatement: a settled submit's entry is only awaited again by a resubmit, which it answers at once; a failed one's id is re-set by the next submit
    } finally {
      this.submits.delete(config.id);
    }
    this.ctx.log.info({ taskId: config.id, containerName, image: config.image_name }, "task submitted");
    this.startInBackground(config.id);
    return this.ctx.store.mustGet(config.id);
  }

  /**
   * Refuses, before anything is kept, a task whose dir is held (a state file there that this
   * release could neither read nor quarantine: a submit would write over it) and one whose
   * task.json would be too large for a later start to read once it gains its reason and times.
   */
  private refuseUnwritable(task: Task): void {
    const hold = this.ctx.dirs.heldBy(this.ctx.dirs.dirFor(task.containerName));
    if (hold !== undefined) throw new TaskStateError(heldMessage(task.id, hold));
    const bytes = encodedTaskStateBytes(task, this.ctx.bootId);
    if (bytes > TASK_STATE_SUBMIT_MAX_BYTES) {
      throw new InvalidTaskConfigError(
        `task config too large: its task.json would be ${bytes} bytes (at most ${TASK_STATE_SUBMIT_MAX_BYTES})`,
      );
    }
  }

  /** Writes the new task's dir, credentials and task.json; on a failure, undoes all of it. */
  private async makeDurable(config: TaskConfig, auth: RegistryAuth, containerName: string): Promise<void> {
    const { persister } = this.commits;
    let taskDir = "";
    let created = false;
    try {
      taskDir = this.ctx.dirs.dirFor(containerName);
      created = !existsSync(taskDir);
      await failpoint("durable-write:task-dir");
      await this.ctx.dirs.make(containerName);
      await failpoint("after-taskdir");
      if (auth.username !== "" || auth.password !== "") {
        await failpoint("durable-write:registry-auth");
        await writeRegistryAuth(taskDir, auth);
      } else {
        // A submit without credentials must never pull with a file some earlier attempt left.
        await unlinkIfPresent(join(taskDir, REGISTRY_AUTH_FILE));
      }
      this.ctx.store.modify(config.id, (d) => {
        d.taskDir = taskDir;
      });
      await persister.persist(config.id);
      await failpoint("after-state:pending");
    } catch (cause) {
      // Nothing of a failed submit may stay: not the task, not its dir, not its credentials.
      this.ctx.store.delete(config.id);
      await persister.settle(config.id);
      // Stryker disable next-line CallExpression: only frees the entry; a deleted task's unsynced id is skipped by persist and filtered out of unsyncedIds
      persister.forget(config.id);
      // Stryker disable next-line ConditionalExpression,StringLiteral: taskDir is "" only when dirFor threw, before `created` was set: discarding "" deletes nothing (deleteRegistryAuth("") returns at once)
      if (taskDir !== "") await this.discardSubmitDir(taskDir, created);
      const storageCause = isStorageError(cause)
        ? cause instanceof TaskPersistError
          ? cause.cause
          : cause
        : await this.storageFault();
      if (storageCause !== undefined) {
        this.ctx.storage?.markFailed(storageCause);
        throw new StorageUnavailableError(storageCause);
      }
      throw new TaskOperationError(`failed to create task ${config.id}: ${errorMessage(cause)}`, {
        cause,
      });
    }
  }

  /**
   * Whether the home's storage is what failed: some calls report a storage fault as something
   * else (a recursive mkdir on a read-only file system answers ENOENT), so a probe decides.
   */
  private async storageFault(): Promise<Error | undefined> {
    const failed = await this.ctx.storage?.probe();
    return isStorageError(failed) ? failed : undefined;
  }

  /**
   * Undoes what a failed submit wrote: a dir it created is deleted (or renamed aside); in a dir
   * that was already there, only the credentials (a state file there may not be this submit's).
   */
  private async discardSubmitDir(taskDir: string, created: boolean): Promise<void> {
    if (created) await this.ctx.dirs.remove(taskDir);
    else await deleteRegistryAuth(taskDir);
  }
}

/** Deletes a file; a missing one is fine, any other failure is thrown. */
async function unlinkIfPresent(path: string): Promise<void> {
  try {
    await unlink(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
}
