import { errorMessage } from "../errors/error-message.js";
import { logExpected } from "../logging/log-fields.js";
import type { Task } from "../tasks/task.js";
import { TaskNotFoundError } from "../tasks/task-store.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { createAndStart } from "./container-start.js";
import { failpoint } from "./failpoints.js";
import type { ImagePulls } from "./image-pull.js";
import { deleteRegistryAuth } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import { checkStillWanted, StartAbandoned, StartStepError } from "./start-errors.js";
import { prepareTask } from "./start-prepare.js";
import type { TaskCommits } from "./task-commits.js";

const statusRank = (status: TaskStatus): number => TASK_STATUSES.indexOf(status);

/**
 * The start sequence — prepare → pull → create → start → running, then return — and the starts
 * in flight. Every step is idempotent, so a start interrupted by a restart can simply run again
 * from the persisted status. A start that fails terminates its task with the step's reason; one
 * overtaken by a terminate, a remove or the shutdown is abandoned (not an error of the task).
 */
export class TaskStarts {
  private readonly starts = new Map<string, Promise<void>>();

  constructor(
    private readonly ctx: RunnerContext,
    private readonly commits: TaskCommits,
    private readonly pulls: ImagePulls,
    /** Releases a task's resources (the caller holds its lock). */
    private readonly release: (id: string) => Promise<void>,
  ) {}

  /** Starts (or resumes) a task without waiting; `awaitAll` collects the promises. */
  startInBackground(id: string): void {
    if (this.starts.has(id)) return;
    // From the next turn of the event loop: the submit's answer goes out before the start's
    // first step (whose state is written without waiting) can run.
    const run = new Promise<void>((resolve) => setImmediate(resolve))
      .then(() => this.start(id))
      .catch((error: unknown) => this.ctx.log.error({ taskId: id, err: error }, "start failed unexpectedly"))
      .finally(() => this.starts.delete(id));
    this.starts.set(id, run);
  }

  /** Waits until every start in flight has reached a safe point (shutdown). */
  async awaitAll(): Promise<void> {
    await Promise.allSettled([...this.starts.values()]);
  }

  /** Waits for the task's start in flight, if any, to return. */
  async awaitStart(id: string): Promise<void> {
    await this.starts.get(id);
  }

  /**
   * prepare → pull → create → start → running, then return. Every step is idempotent, so a
   * start interrupted by a restart can simply run again from the persisted status.
   */
  async start(id: string): Promise<void> {
    const { store, log } = this.ctx;
    const initial = store.get(id);
    if (!initial || initial.status === "terminated" || initial.status === "running") return;
    let started = false;
    try {
      // Each step hands the task on as the previous one left it: what they read of it (config,
      // dir, GPU ids) only the start itself changes. What a terminate may change meanwhile is
      // read again where it matters (`checkStillWanted`, and under the lock at the create).
      const preparing = await this.step(id, "preparing");
      await prepareTask(this.ctx, this.commits, preparing);
      const pulling = await this.step(id, "pulling");
      await this.pulls.pull(pulling);
      const creating = await this.step(id, "creating");
      const running = await createAndStart(this.ctx, this.commits, creating);
      // The credentials were kept only to resume the pull after a restart; once `running` is
      // durable, a restart no longer pulls.
      await deleteRegistryAuth(running.taskDir);
      started = true;
    } catch (error) {
      if (error instanceof StartAbandoned || error instanceof TaskNotFoundError) {
        log.info({ taskId: id, why: errorMessage(error) }, "start abandoned");
      } else {
        const reason = error instanceof StartStepError ? error.reason : "executor_error";
        const message = errorMessage(error);
        logExpected(log, "warn", { taskId: id, reason }, error, "task failed to start");
        if (store.get(id)?.status !== "terminated") this.ctx.observer?.taskFinalized(reason);
        await this.commits
          .commit(id, (d) => {
            d.status = "terminated";
            d.terminationReason = reason;
            d.terminationMessage = message;
          })
          .catch((e: unknown) => log.error({ taskId: id, err: e }, "failed to record start failure"));
      }
    } finally {
      if (!started) await this.handOver(id);
    }
  }

  /**
   * Moves a starting task forward without waiting for the write. A restart resumes `pending`
   * up to `creating` alike (every step is idempotent and a container made before the restart
   * is found by name), and what is taken meanwhile is written when it is taken (GPU ids), so
   * these writes only keep the status a restart shows current. The `running` commit waits for
   * them. (The failpoint fires before the write is durable.)
   */
  private async step(id: string, status: "preparing" | "pulling" | "creating"): Promise<Task> {
    // Read again at every step, never handed on: a terminate or a remove that landed during the
    // previous step must stop the start here.
    checkStillWanted(this.ctx.store, id);
    const task = this.commits.commitInBackground(id, (d) => {
      d.startInFlight = true;
      // Stryker disable next-line EqualityOperator: `>=` only re-sets the status it already has
      if (statusRank(status) > statusRank(d.status)) d.status = status;
    });
    await failpoint(`after-state:${status}`);
    return task;
  }

  /** A start that did not reach `running` hands the task over: release now if nothing can run. */
  private async handOver(id: string): Promise<void> {
    // Read again, not handed on: the start may have ended because a terminate or a remove
    // changed the task, and what is left to do depends on the task as it is now.
    const task = this.ctx.store.get(id);
    if (!task) return;
    await this.commits.commit(id, (d) => (d.startInFlight = false)).catch(() => undefined);
    // With a container, the reconciler owns the rest (it may have to stop it first).
    if (task.containerId === undefined && task.status === "terminated") {
      await this.ctx.store
        .withLock(id, () => this.release(id))
        .catch((error: unknown) => {
          this.ctx.log.error({ taskId: id, err: error }, "release after failed start failed");
        });
    }
  }
}
