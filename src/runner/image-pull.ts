import { createWriteStream } from "node:fs";
import { join } from "node:path";
import type { PullAuth } from "../docker/docker-client.js";
import { consumePullStream, PullTracker } from "../docker/pull-progress.js";
import { errorMessage } from "../errors/error-message.js";
import { deadlineSignal } from "../exec/deadline-signal.js";
import type { Task } from "../tasks/task.js";
import {
  formatPullReference,
  isLatestOrUntagged,
  parseImageReference,
  registryServerAddress,
} from "../tasks/image-ref.js";
import { failpoint } from "./failpoints.js";
import { readRegistryAuth } from "./registry-auth-file.js";
import { IMAGE_PULL_TIMEOUT_MS, type RunnerContext } from "./runner-context.js";
import { StartAbandoned, startStep, StartStepError } from "./start-errors.js";
import type { TaskCommits } from "./task-commits.js";

/**
 * The pull step of a start, and the pulls in flight: a terminate cancels its task's pull, the
 * shutdown all of them (the task stays `pulling` and resumes at the next start).
 */
export class ImagePulls {
  private readonly pulls = new Map<string, AbortController>();
  /** Image checks in flight, by reference: a burst of submits of one image asks the engine once. */
  private readonly imageChecks = new Map<string, Promise<boolean>>();

  constructor(
    private readonly ctx: RunnerContext,
    private readonly commits: TaskCommits,
  ) {}

  /** Cancels the task's pull in flight, if any. */
  cancel(id: string, reason: Error): void {
    this.pulls.get(id)?.abort(reason);
  }

  /** Cancels every pull in flight (shutdown): the tasks stay in `pulling` and resume later. */
  cancelAll(): void {
    for (const controller of this.pulls.values()) controller.abort(new Error("shim shutting down"));
  }

  /**
   * Pulls the image of the task (as the start's `pulling` step left it), unless a pinned one is
   * present, bounded by the pull timeout and cancelled by the shutdown or a terminate. The raw
   * progress goes to `pull.log` in the task dir.
   */
  async pull(task: Task): Promise<void> {
    const { docker, store, log } = this.ctx;
    const { id } = task;
    const request = await startStep("creating_container_error", "pullImage", () => this.pullRequest(task));
    if (request === undefined) return;
    const { pullRef, auth } = request;

    const controller = new AbortController();
    this.pulls.set(id, controller);
    const bounded = deadlineSignal(this.ctx.shutdown, IMAGE_PULL_TIMEOUT_MS);
    const onAbort = (): void => controller.abort(bounded.signal.reason);
    // Stryker disable next-line ObjectLiteral,BooleanLiteral: an AbortSignal fires "abort" once at most
    bounded.signal.addEventListener("abort", onAbort, { once: true });
    // A shutdown or terminate may have landed before the controller was registered: the task
    // is read again here, not taken from the snapshot, since a terminate cancels only a pull it
    // can see.
    if (bounded.signal.aborted) onAbort();
    if ((store.get(id)?.status ?? "terminated") === "terminated")
      controller.abort(new Error("task terminated"));
    const tracker = new PullTracker();
    // A write stream keeps the raw lines in order; pull.log is a diagnostic, never a reason to fail.
    const pullLog = createWriteStream(join(task.taskDir, "pull.log"), { mode: 0o600 });
    pullLog.on("error", () => undefined);
    // Monotonic: a rate limit, which a stepped wall clock would stop or unleash.
    let lastUpdate = Number.NEGATIVE_INFINITY;
    try {
      const stream = await docker.pullImage(pullRef, auth, controller.signal);
      await failpoint("mid-pull");
      await consumePullStream(stream, {
        signal: controller.signal,
        onMessage: (message, rawLine) => {
          tracker.update(message);
          pullLog.write(`${rawLine}\n`);
          const now = performance.now();
          if (now - lastUpdate >= 100) {
            lastUpdate = now;
            const progress = tracker.progress();
            if (progress && store.get(id)) this.commits.inMemoryOnly(id, (d) => (d.pullProgress = progress));
          }
        },
      });
      const pulled = tracker.progress();
      if (pulled && store.get(id)) this.commits.inMemoryOnly(id, (d) => (d.pullProgress = pulled));
      if (pulled) this.ctx.observer?.pulledBytes(pulled.downloaded_bytes);
      log.info({ taskId: id, image: pullRef }, "image pulled");
    } catch (cause) {
      if (this.ctx.shutdown.aborted) throw new StartAbandoned("shim shutting down during pull");
      const progress = tracker.progress();
      const detail = progress
        ? ` (downloaded ${progress.downloaded_bytes} of ${progress.total_bytes} bytes)`
        : "";
      throw new StartStepError(
        "creating_container_error",
        `pullImage error: failed pulling ${pullRef}${detail}: ${errorMessage(cause)}`,
        { cause },
      );
    } finally {
      bounded.signal.removeEventListener("abort", onAbort);
      bounded.dispose();
      this.pulls.delete(id);
      await new Promise<void>((resolve) => pullLog.end(resolve));
    }
  }

  /**
   * What to pull for a task: its reference and the stored registry credentials, or `undefined`
   * when a pinned image (not `latest` or untagged) is already present.
   */
  private async pullRequest(
    task: Task,
  ): Promise<{ pullRef: string; auth: PullAuth | undefined } | undefined> {
    const ref = parseImageReference(task.config.image_name);
    const pullRef = formatPullReference(ref);
    if (!isLatestOrUntagged(ref) && (await this.imagePresent(pullRef))) {
      this.ctx.log.debug({ taskId: task.id, image: pullRef }, "image present, pull skipped");
      return undefined;
    }
    const creds = await readRegistryAuth(task.taskDir);
    const auth = creds && {
      username: creds.username,
      password: creds.password,
      serveraddress: registryServerAddress(ref),
    };
    return { pullRef, auth };
  }

  /**
   * Whether the engine has the image, sharing a check already in flight for the same reference.
   * Only in-flight checks are shared, never a past answer: an image removed meanwhile is seen.
   */
  private imagePresent(reference: string): Promise<boolean> {
    let check = this.imageChecks.get(reference);
    if (!check) {
      check = this.ctx.docker.imageExists(reference).finally(() => this.imageChecks.delete(reference));
      this.imageChecks.set(reference, check);
    }
    return check;
  }
}
