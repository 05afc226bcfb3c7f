import type { Task } from "../tasks/task.js";
import type { RegistryAuth, TaskConfig } from "../tasks/task-config.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { ImagePulls } from "./image-pull.js";
import type { RunnerContext } from "./runner-context.js";
import { TaskCommits, type TaskChange } from "./task-commits.js";
import { hostKeysByUser, reconcileHostKeys } from "./task-host-keys.js";
import type { TaskPersister } from "./task-persister.js";
import { releaseTask } from "./task-release.js";
import { TaskStarts } from "./task-start.js";
import { TaskSubmissions } from "./task-submission.js";
import { TaskTermination } from "./task-termination.js";

// The errors a request answers with, where the HTTP edge has always imported them from.
export { TaskConflictError, TaskOperationError, TaskStateError } from "./task-errors.js";

/**
 * The task lifecycle: submit, start (prepare → pull → create → start → running, then return),
 * terminate, remove and the one idempotent release. Completion is not here: the reconciler
 * alone turns container state into a terminal status, so nothing depends on a promise that a
 * `kill -9` could cut.
 *
 * One object for its callers over the parts, each in its own module: the one writer of task state
 * (`task-commits.ts`), submission (`task-submission.ts`), the start sequence (`task-start.ts`,
 * `start-prepare.ts`, `image-pull.ts`, `container-start.ts`), the release (`task-release.ts`),
 * terminate and remove (`task-termination.ts`), and the host keys (`task-host-keys.ts`).
 */
export class TaskRunner {
  /** The commits' persister, read for its not yet durable tasks; it writes only for the commits. */
  readonly persister: TaskPersister;
  private readonly commits: TaskCommits;
  private readonly pulls: ImagePulls;
  private readonly starts: TaskStarts;
  private readonly submissions: TaskSubmissions;
  private readonly termination: TaskTermination;

  constructor(private readonly ctx: RunnerContext) {
    this.commits = new TaskCommits(ctx);
    this.persister = this.commits.persister;
    this.pulls = new ImagePulls(ctx, this.commits);
    // Through `release` below, as the reconciler's releases go: one path for every release.
    const release = (id: string): Promise<void> => this.release(id);
    this.starts = new TaskStarts(ctx, this.commits, this.pulls, release);
    this.submissions = new TaskSubmissions(ctx, this.commits, (id) => this.startInBackground(id));
    this.termination = new TaskTermination(ctx, this.commits, this.pulls, this.starts, release);
  }

  /** Applies a change and makes it durable; a storage error leaves it *not yet durable* ({@link TaskCommits.commit}). */
  commit(id: string, fn: TaskChange): Promise<Task> {
    return this.commits.commit(id, fn);
  }

  /** A commit visible only once durable ({@link TaskCommits.commitVisibleWhenDurable}). */
  commitVisibleWhenDurable(id: string, fn: TaskChange): Promise<Task> {
    return this.commits.commitVisibleWhenDurable(id, fn);
  }

  /** Writes a task as the restore rebuilt it; a failure leaves it not yet durable ({@link TaskCommits.writeRestored}). */
  writeRestored(id: string): Promise<void> {
    return this.commits.writeRestored(id);
  }

  /** Storage is back: writes what is not yet durable ({@link TaskCommits.catchUpStorage}). */
  catchUpStorage(): Promise<boolean> {
    return this.commits.catchUpStorage();
  }

  /** Adds a task durably and starts it in the background ({@link TaskSubmissions.submit}). */
  submit(config: TaskConfig, auth: RegistryAuth): Promise<Task> {
    return this.submissions.submit(config, auth);
  }

  /** Starts (or resumes) a task without waiting; `awaitStarts` collects the promises. */
  startInBackground(id: string): void {
    this.starts.startInBackground(id);
  }

  /** Waits until every start in flight has reached a safe point (shutdown). */
  awaitStarts(): Promise<void> {
    return this.starts.awaitAll();
  }

  /** Cancels every pull in flight (shutdown): the tasks stay in `pulling` and resume later. */
  cancelPulls(): void {
    this.pulls.cancelAll();
  }

  /** prepare → pull → create → start → running, then return ({@link TaskStarts.start}). */
  start(id: string): Promise<void> {
    return this.starts.start(id);
  }

  /** Makes every user's shim entries in authorized_keys the union of the live tasks' keys. */
  reconcileHostKeys(extraUsers: readonly string[] = []): Promise<void> {
    return reconcileHostKeys(this.ctx, extraUsers);
  }

  /** The host keys every live task needs, per user (a terminated task needs none). */
  hostKeysByUser(extraUsers: readonly string[] = []): Map<string, string[]> {
    return hostKeysByUser(this.ctx.store, extraUsers);
  }

  /** Releases everything a task holds, exactly once; the caller holds the task lock ({@link releaseTask}). */
  release(id: string): Promise<void> {
    return releaseTask(this.ctx, this.commits, id);
  }

  /** Terminates a task, its intent durable first ({@link TaskTermination.terminate}). */
  terminate(id: string, timeoutSeconds: number, reason: TerminationReason, message: string): Promise<Task> {
    return this.termination.terminate(id, timeoutSeconds, reason, message);
  }

  /** Removes a terminated task: container, resources, dir, record ({@link TaskTermination.remove}). */
  remove(id: string): Promise<void> {
    return this.termination.remove(id);
  }
}
