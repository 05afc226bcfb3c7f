import { existsSync } from "node:fs";
import { unlink } from "node:fs/promises";
import { join } from "node:path";
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
import type { NewTaskFiles, TaskCommits } from "./task-commits.js";
import { TaskConflictError, TaskStateError } from "./task-errors.js";

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
    const task = newTask(config);
    this.refuseUnwritable(task);
    // In the store as soon as this call is made (before its first await), so a retry that
    // arrives meanwhile finds the task and waits for the entry set here.
    const persisted = this.commits.createDurably(task, this.newTaskFiles(auth));
    this.submits.set(config.id, persisted);
    try {
      await persisted;
      // Stryker disable next-line BlockStatement: a settled submit's entry is only awaited again by a resubmit, which it answers at once; a failed one's id is re-set by the next submit
    } finally {
      this.submits.delete(config.id);
    }
    this.ctx.log.info(
      { taskId: config.id, containerName: task.containerName, image: config.image_name },
      "task submitted",
    );
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

  /**
   * The new task's dir and registry credentials; undone on a failure (the dir deleted if this
   * submit created it, else only the credentials).
   */
  private newTaskFiles(auth: RegistryAuth): NewTaskFiles {
    let taskDir = "";
    let created = false;
    return {
      write: async (task) => {
        taskDir = this.ctx.dirs.dirFor(task.containerName);
        created = !existsSync(taskDir);
        await failpoint("durable-write:task-dir");
        await this.ctx.dirs.make(task.containerName);
        await failpoint("after-taskdir");
        if (auth.username !== "" || auth.password !== "") {
          await failpoint("durable-write:registry-auth");
          await writeRegistryAuth(taskDir, auth);
        } else {
          // A submit without credentials must never pull with a file some earlier attempt left.
          await unlinkIfPresent(join(taskDir, REGISTRY_AUTH_FILE));
        }
        const dir = taskDir;
        return (d) => {
          d.taskDir = dir;
        };
      },
      undo: async () => {
        // Stryker disable next-line ConditionalExpression,StringLiteral: taskDir is "" only when dirFor threw, before `created` was set: discarding "" deletes nothing (deleteRegistryAuth("") returns at once)
        if (taskDir !== "") await this.discardSubmitDir(taskDir, created);
      },
    };
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
