import { engineTime } from "../docker/docker-client.js";
import { errorMessage } from "../errors/error-message.js";
import { heldMessage, type Task } from "../tasks/task.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { failpoint } from "./failpoints.js";
import type { ImagePulls } from "./image-pull.js";
import { ownContainerIdByName } from "./own-container.js";
import type { RunnerContext } from "./runner-context.js";
import type { TaskCommits } from "./task-commits.js";
import { TaskOperationError, TaskStateError } from "./task-errors.js";
import type { TaskStarts } from "./task-start.js";

/**
 * The end of a task a request asks for: terminate (the intent durable first, then the stop) and
 * remove (container, resources, dir, record). Both hold the task lock; the release of resources
 * itself is the one idempotent `release` they are given.
 */
export class TaskTermination {
  constructor(
    private readonly ctx: RunnerContext,
    private readonly commits: TaskCommits,
    private readonly pulls: ImagePulls,
    private readonly starts: TaskStarts,
    /** Releases a task's resources (the caller holds its lock). */
    private readonly release: (id: string) => Promise<void>,
  ) {}

  /**
   * Terminates a task: the intent (reason, message) is persisted first, then a pull is cancelled
   * or the container stopped, then resources are released. A task whose container may run stays
   * `running` until the container has stopped, as dstack-shim reports it: a control plane that
   * sees `terminated` may give the task's GPUs to another job. Its intent is durable all the same
   * (task.json holds the reason beside `running`), so a crash mid-stop still ends with this
   * reason (the restore keeps the intent, the reconciler finishes the stop). Any other task is
   * `terminated` at once. Terminating a terminated task is a no-op that keeps the first reason,
   * and so is a second terminate of a task whose stop is pending (its first reason wins).
   */
  async terminate(
    id: string,
    timeoutSeconds: number,
    reason: TerminationReason,
    message: string,
  ): Promise<Task> {
    const { store, log } = this.ctx;
    const unlock = await store.lock(id);
    try {
      const before = store.mustGet(id);
      if (before.held) throw new TaskStateError(heldMessage(id, before.held));
      const stopsFirst = before.status === "running" && before.containerId !== undefined;
      // The intent is durable before anything acts on it; if the home cannot take it, nothing
      // changed (the reconciler must never stop a container for a terminate the disk lacks).
      // A terminated task, or one whose intent is recorded, keeps its first reason.
      let task = before;
      if (before.status !== "terminated" && before.terminationReason === "") {
        task = await this.commits.commitDurably(id, (d) => {
          if (!stopsFirst) d.status = "terminated";
          d.terminationReason = reason;
          d.terminationMessage = message;
        });
        log.info(
          { taskId: id, reason, from: before.status },
          stopsFirst ? "task terminating" : "task terminated",
        );
        if (!stopsFirst) this.ctx.observer?.taskFinalized(reason);
      }
      await failpoint("after-terminate-intent");
      this.pulls.cancel(id, new Error(`terminated: ${task.terminationReason || reason}`));
      // A repeated terminate of a stopped container (exit code known) has nothing to stop.
      const alreadyStopped = before.status === "terminated" && before.exitCode !== undefined;
      if (task.containerId !== undefined && !alreadyStopped) {
        await this.stop(before, task, task.containerId, timeoutSeconds, stopsFirst);
      }
      // A start in flight releases its own resources when it notices the terminate.
      if (!store.mustGet(id).startInFlight) await this.release(id);
      return store.mustGet(id);
    } finally {
      unlock();
    }
  }

  /**
   * Stops the task's container and records how it ended: `terminated` now for a task that stayed
   * `running` until the stop, else only the exit code it lacked.
   */
  private async stop(
    before: Task,
    task: Task,
    containerId: string,
    timeoutSeconds: number,
    stopsFirst: boolean,
  ): Promise<void> {
    const { docker, log } = this.ctx;
    const id = task.id;
    try {
      await docker.stopContainer(containerId, timeoutSeconds);
    } catch (cause) {
      // The intent stays recorded (a task still `running` stays so); the reconciler stops it.
      throw new TaskOperationError(`failed to stop container: ${errorMessage(cause)}`, { cause });
    }
    await failpoint("after-stop-before-persist");
    const details = await docker.inspectContainer(containerId).catch(() => undefined);
    const exited = details !== undefined && details.state !== "running" && details.state !== "created";
    if (stopsFirst) {
      // Only now `terminated`, with the reason recorded first. Visible at once: the intent
      // is already durable, so a crash before this write ends the same way after a restart.
      const finishedAt = exited ? engineTime(details.finishedAt) : undefined;
      const done = await this.commits.commit(id, (d) => {
        d.status = "terminated";
        if (exited && d.exitCode === undefined) d.exitCode = details.exitCode;
        if (finishedAt !== undefined) d.finishedAt = finishedAt;
      });
      log.info(
        {
          taskId: id,
          reason: done.terminationReason,
          from: before.status,
          exitCode: done.exitCode,
          containerState: details?.state,
        },
        "task terminated",
      );
      this.ctx.observer?.taskFinalized(done.terminationReason);
    } else if (exited && task.exitCode === undefined) {
      await this.commits.commit(id, (d) => (d.exitCode = details.exitCode));
    }
  }

  /** Removes a terminated task: its container (confirmed), its resources, its dir, its record. */
  async remove(id: string): Promise<void> {
    const { store, docker, dirs, log } = this.ctx;
    // A start overtaken by a terminate stops at its next step; let it hand its resources over
    // first, or a volume it is mounting right now would outlive the release below.
    if (store.mustGet(id).status === "terminated") await this.starts.awaitStart(id);
    const unlock = await store.lock(id);
    try {
      const task = store.mustGet(id);
      if (task.held) throw new TaskStateError(heldMessage(id, task.held));
      if (task.status !== "terminated") {
        throw new TaskStateError(`cannot remove task ${id} with ${task.status} status`);
      }
      // The task dir must be writable before the container goes: a removal the disk cannot
      // follow would answer 200 and bring the task back at the next start.
      await this.commits.commitDurably(id, () => undefined);
      try {
        const target = task.containerId ?? (await ownContainerIdByName(this.ctx, task));
        if (target !== "") await docker.removeContainer(target);
      } catch (cause) {
        throw new TaskOperationError(`failed to remove container task=${id}: ${errorMessage(cause)}`, {
          cause,
        });
      }
      await failpoint("after-container-remove");
      await this.release(id);
      await this.commits.discard(id);
      if (task.taskDir !== "") await dirs.remove(task.taskDir);
      log.info({ taskId: id }, "task removed");
    } finally {
      unlock();
    }
  }
}
