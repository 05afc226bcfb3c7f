import { createWriteStream, existsSync } from "node:fs";
import { unlink } from "node:fs/promises";
import { UserKeysReconcileError } from "../host/authorized-keys.js";
import { VolumePrepareInterruptedError } from "../host/volumes.js";
import { join } from "node:path";
import { buildContainerSpec } from "../docker/container-spec.js";
import { engineTime, type ContainerState, type PullAuth } from "../docker/docker-client.js";
import { DockerConflictError } from "../docker/docker-errors.js";
import {
  formatPullReference,
  isLatestOrUntagged,
  parseImageReference,
  registryServerAddress,
} from "../tasks/image-ref.js";
import { consumePullStream, PullTracker } from "../docker/pull-progress.js";
import { deadlineSignal } from "../exec/deadline-signal.js";
import { gpuContainerConfig } from "../docker/gpu-devices.js";
import { isStorageError, StorageUnavailableError } from "../state/storage-health.js";
import { TaskDirs } from "../state/task-dirs.js";
import { newTask, type Task, type TaskDraft } from "../tasks/task.js";
import { sameTaskConfig, type RegistryAuth, type TaskConfig } from "../tasks/task-config.js";
import { TaskNotFoundError } from "../tasks/task-store.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { IMAGE_PULL_TIMEOUT_MS, LAST_LOG_LINES, type RunnerContext } from "./runner-context.js";
import { failpoint } from "./failpoints.js";
import {
  deleteRegistryAuth,
  readRegistryAuth,
  REGISTRY_AUTH_FILE,
  writeRegistryAuth,
} from "./registry-auth-file.js";
import { TaskPersistError, TaskPersister } from "./task-persister.js";
import { logExpected } from "../logging/log-fields.js";
import { errorMessage } from "../errors/error-message.js";

/** A submit reused an id with a different config. */
export class TaskConflictError extends Error {
  override readonly name = "TaskConflictError";
}
/** The operation is not allowed in the task's current status (HTTP 409). */
export class TaskStateError extends Error {
  override readonly name = "TaskStateError";
}
/** A Docker or host operation failed while serving a request (HTTP 500). */
export class TaskOperationError extends Error {
  override readonly name = "TaskOperationError";
}

/** A start step failed; carries the reason the task terminates with. */
class StartStepError extends Error {
  // Stryker disable next-line StringLiteral: never leaves this module (start() uses its reason and message) and pino types an error by its constructor
  override readonly name = "StartStepError";
  constructor(
    readonly reason: TerminationReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/**
 * Runs one step of a start. Its failure terminates the task with `reason` and the message
 * `<what> error: <the cause's message>` (dstack-shim's wording), or the cause's message alone
 * when `what` is undefined.
 */
async function startStep<T>(
  reason: TerminationReason,
  what: string | undefined,
  run: () => T | Promise<T>,
): Promise<T> {
  try {
    return await run();
  } catch (cause) {
    const message = what === undefined ? errorMessage(cause) : `${what} error: ${errorMessage(cause)}`;
    throw new StartStepError(reason, message, { cause });
  }
}

/** The start was overtaken by a terminate or remove; not an error of the task. */
class StartAbandoned extends Error {
  // Stryker disable next-line StringLiteral: never leaves this module (start() logs its message only)
  override readonly name = "StartAbandoned";
}

const statusRank = (status: TaskStatus): number => TASK_STATUSES.indexOf(status);

const foreignMessage = (id: string): string =>
  `task ${id} has a state file of a newer taskshim version; only that version may change it`;

/**
 * The task lifecycle: submit, start (prepare → pull → create → start → running, then return),
 * terminate, remove and the one idempotent release. Completion is not here: the reconciler
 * alone turns container state into a terminal status, so nothing depends on a promise that a
 * `kill -9` could cut.
 */
export class TaskRunner {
  readonly persister: TaskPersister;
  private readonly pulls = new Map<string, AbortController>();
  private readonly starts = new Map<string, Promise<void>>();
  private readonly submits = new Map<string, Promise<void>>();
  /** Image checks in flight, by reference: a burst of submits of one image asks the engine once. */
  private readonly imageChecks = new Map<string, Promise<boolean>>();

  constructor(private readonly ctx: RunnerContext) {
    this.persister = new TaskPersister(ctx.store, ctx.bootId, ctx.log, ctx.storage);
  }

  /**
   * Applies a change to a task and makes it durable before returning. For the shim's own steps
   * (start, reconciler, release): when the home cannot take the write (a storage error), the
   * change stays in memory, the task is left *not yet durable* and written once storage is back
   * (`catchUpStorage`); a restart before that re-derives it from the container, as after a kill.
   */
  async commit(id: string, fn: (draft: TaskDraft) => void): Promise<Task> {
    const before = this.ctx.store.mustGet(id).status;
    const task = this.ctx.store.modify(id, fn);
    try {
      await this.persister.persist(id);
    } catch (error) {
      if (!(error instanceof TaskPersistError && isStorageError(error.cause))) throw error;
      this.ctx.log.warn(
        { taskId: id, status: task.status },
        "task state not yet durable; written when storage is back",
      );
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
  async commitVisibleWhenDurable(id: string, fn: (draft: TaskDraft) => void): Promise<Task> {
    const before = this.ctx.store.mustGet(id).status;
    let task: Task;
    try {
      task = await this.persister.persistChange(id, fn);
    } catch (error) {
      if (!(error instanceof TaskPersistError && isStorageError(error.cause))) throw error;
      task = this.ctx.store.modify(id, fn);
      this.ctx.log.warn(
        { taskId: id, status: task.status },
        "task state not yet durable; written when storage is back",
      );
    }
    if (task.status !== before) await failpoint(`after-state:${task.status}`);
    return task;
  }

  /**
   * Applies a change that a request asked for only once it is durable: on a failure nothing
   * changed, in memory or on disk, and the error says whether storage was the cause (HTTP 503).
   */
  private async commitDurably(id: string, fn: (draft: TaskDraft) => void): Promise<Task> {
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
          (t) => t.taskDir !== "" && !t.foreign && (t.status === "running" || t.status === "terminated"),
        )
        .map((t) => deleteRegistryAuth(t.taskDir)),
    );
    return written;
  }

  /**
   * Adds a task, persists it (so a 200 answer is durable), and starts it in the background.
   * The same id with the same config returns the existing task (a retried submit whose answer
   * was lost); a different config under that id is a conflict.
   */
  async submit(config: TaskConfig, auth: RegistryAuth): Promise<Task> {
    const existing = this.ctx.store.get(config.id);
    if (existing) {
      if (!sameTaskConfig(existing.config, config)) {
        throw new TaskConflictError(`task ${config.id} is already submitted with a different config`);
      }
      await this.submits.get(config.id);
      return this.ctx.store.mustGet(config.id);
    }
    const { containerName } = this.ctx.store.add(newTask(config));
    const persisted = (async () => {
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
        await this.persister.persist(config.id);
        await failpoint("after-state:pending");
      } catch (cause) {
        // Nothing of a failed submit may stay: not the task, not its dir, not its credentials.
        this.ctx.store.delete(config.id);
        await this.persister.settle(config.id);
        // Stryker disable next-line CallExpression: only frees the entry; a deleted task's unsynced id is skipped by persist and filtered out of unsyncedIds
        this.persister.forget(config.id);
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
    })();
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

  /** Starts (or resumes) a task without waiting; `awaitStarts` collects the promises. */
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
  async awaitStarts(): Promise<void> {
    await Promise.allSettled([...this.starts.values()]);
  }

  /** Cancels every pull in flight (shutdown): the tasks stay in `pulling` and resume later. */
  cancelPulls(): void {
    for (const controller of this.pulls.values()) controller.abort(new Error("shim shutting down"));
  }

  /**
   * Moves a starting task forward without waiting for the write. A restart resumes `pending`
   * up to `creating` alike (every step is idempotent and a container made before the restart
   * is found by name), and what is taken meanwhile is written when it is taken (GPU ids), so
   * these writes only keep the status a restart shows current. The `running` commit waits for
   * them. (The failpoint fires before the write is durable.)
   */
  private async step(id: string, status: "preparing" | "pulling" | "creating"): Promise<void> {
    this.checkStillWanted(id);
    this.ctx.store.modify(id, (d) => {
      d.startInFlight = true;
      // Stryker disable next-line EqualityOperator: `>=` only re-sets the status it already has
      if (statusRank(status) > statusRank(d.status)) d.status = status;
    });
    this.persister.persist(id).catch(() => undefined);
    await failpoint(`after-state:${status}`);
  }

  /** Throws `StartAbandoned` once the task was terminated or removed underneath the start. */
  private checkStillWanted(id: string): void {
    const current = this.ctx.store.get(id);
    if (!current) throw new StartAbandoned("task removed");
    if (current.status === "terminated") throw new StartAbandoned("task terminated");
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
      await this.step(id, "preparing");
      await this.prepare(id);
      await this.step(id, "pulling");
      await this.pull(id);
      await this.step(id, "creating");
      await this.createAndStart(id);
      // The credentials were kept only to resume the pull after a restart; once `running` is
      // durable, a restart no longer pulls.
      await deleteRegistryAuth(store.mustGet(id).taskDir);
      started = true;
    } catch (error) {
      if (error instanceof StartAbandoned || error instanceof TaskNotFoundError) {
        log.info({ taskId: id, why: errorMessage(error) }, "start abandoned");
      } else {
        const reason = error instanceof StartStepError ? error.reason : "executor_error";
        const message = errorMessage(error);
        logExpected(log, "warn", { taskId: id, reason }, error, "task failed to start");
        if (store.get(id)?.status !== "terminated") this.ctx.observer?.taskFinalized(reason);
        await this.commit(id, (d) => {
          d.status = "terminated";
          d.terminationReason = reason;
          d.terminationMessage = message;
        }).catch((e: unknown) => log.error({ taskId: id, err: e }, "failed to record start failure"));
      }
    } finally {
      if (!started) await this.handOver(id);
    }
  }

  /** A start that did not reach `running` hands the task over: release now if nothing can run. */
  private async handOver(id: string): Promise<void> {
    const task = this.ctx.store.get(id);
    if (!task) return;
    await this.commit(id, (d) => (d.startInFlight = false)).catch(() => undefined);
    // With a container, the reconciler owns the rest (it may have to stop it first).
    if (task.containerId === undefined && task.status === "terminated") {
      await this.ctx.store
        .withLock(id, () => this.release(id))
        .catch((error: unknown) => {
          this.ctx.log.error({ taskId: id, err: error }, "release after failed start failed");
        });
    }
  }

  private async prepare(id: string): Promise<void> {
    const { gpuLock, volumes } = this.ctx;
    const task = this.ctx.store.mustGet(id);
    const config = task.config;
    if (config.gpu !== 0 && task.gpuIds.length === 0) {
      const ids = await startStep("executor_error", undefined, () => gpuLock.acquire(config.gpu));
      await failpoint("after-gpu-acquire");
      // Committed at once, so a concurrent terminate or a failure releases exactly these.
      try {
        this.checkStillWanted(id);
        await this.commit(id, (d) => (d.gpuIds = ids));
      } catch (error) {
        gpuLock.release(ids);
        throw error;
      }
    }
    if (config.host_ssh_keys.length > 0) {
      try {
        await this.reconcileHostKeys();
      } catch (cause) {
        // One user's broken ~/.ssh fails only that user's tasks: another user's failure is logged.
        const own = failureOfUser(cause, config.host_ssh_user);
        if (own) throw new StartStepError("executor_error", `host ssh keys: ${own.message}`, { cause: own });
        this.ctx.log.error({ taskId: id, err: cause }, "host ssh keys of other users not reconciled");
      }
      await failpoint("after-keys-write");
    }
    try {
      await startStep("executor_error", "prepareVolumes", () =>
        volumes.prepareVolumes(
          config.volumes,
          (index) => failpoint(`after-volume-mount:${index + 1}`) ?? Promise.resolve(),
        ),
      );
    } catch (error) {
      // A graceful stop is never worse than a kill -9: a volume command the shutdown cut (mkfs,
      // blkid, mount…) leaves the task `preparing`, and the next start prepares it again (every
      // step is idempotent), as an interrupted pull resumes.
      if (error instanceof StartStepError && error.cause instanceof VolumePrepareInterruptedError) {
        throw new StartAbandoned("shim shutting down during volume preparation");
      }
      throw error;
    }
    await startStep("executor_error", "prepareInstanceMountPoints", () =>
      volumes.prepareInstanceMounts(config.instance_mounts),
    );
  }

  private async pull(id: string): Promise<void> {
    const { docker, store, log } = this.ctx;
    const task = store.mustGet(id);
    const request = await startStep("creating_container_error", "pullImage", () => this.pullRequest(task));
    if (request === undefined) return;
    const { pullRef, auth } = request;

    const controller = new AbortController();
    this.pulls.set(id, controller);
    const bounded = deadlineSignal(this.ctx.shutdown, IMAGE_PULL_TIMEOUT_MS);
    const onAbort = (): void => controller.abort(bounded.signal.reason);
    // Stryker disable next-line ObjectLiteral,BooleanLiteral: an AbortSignal fires "abort" once at most
    bounded.signal.addEventListener("abort", onAbort, { once: true });
    // A shutdown or terminate may have landed before the controller was registered.
    if (bounded.signal.aborted) onAbort();
    if ((store.get(id)?.status ?? "terminated") === "terminated")
      controller.abort(new Error("task terminated"));
    const tracker = new PullTracker();
    // A write stream keeps the raw lines in order; pull.log is a diagnostic, never a reason to fail.
    const pullLog = createWriteStream(join(task.taskDir, "pull.log"), { mode: 0o600 });
    pullLog.on("error", () => undefined);
    let lastUpdate = 0;
    try {
      const stream = await docker.pullImage(pullRef, auth, controller.signal);
      await failpoint("mid-pull");
      await consumePullStream(stream, {
        signal: controller.signal,
        onMessage: (message, rawLine) => {
          tracker.update(message);
          pullLog.write(`${rawLine}\n`);
          const now = Date.now();
          if (now - lastUpdate >= 100) {
            lastUpdate = now;
            const progress = tracker.progress();
            if (progress && store.get(id)) store.modify(id, (d) => (d.pullProgress = progress));
          }
        },
      });
      const pulled = tracker.progress();
      if (pulled && store.get(id)) store.modify(id, (d) => (d.pullProgress = pulled));
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

  /**
   * Creates (or adopts) the container and starts it, holding the task lock so a terminate
   * either comes before (nothing is created) or after (it sees the container).
   */
  private async createAndStart(id: string): Promise<void> {
    const { docker, store, log } = this.ctx;
    await store.withLock(id, async () => {
      let task = store.get(id);
      if (!task) throw new StartAbandoned("task removed");
      if (task.status === "terminated") throw new StartAbandoned("task terminated");
      // A task that never recorded a container is not looked up first: if a start cut by a
      // restart did create one, the create below answers 409 and that container is adopted.
      const existing = task.containerId !== undefined ? await this.findOwnContainer(task) : undefined;
      let containerId = existing?.id ?? "";
      // Only a container that never ran is started: one that runs or ran already (its start
      // request landed after a restart) is adopted as it is, and the reconciler takes it from there.
      let needsStart = existing === undefined || existing.state === "created";
      // When the container started: the engine's StartedAt where an inspect tells it (a container
      // adopted as it is, bridge mode's inspect below), else the time the start call returned.
      // Never the time `running` is committed: a slow write puts that after an instant exit.
      let startedAt = needsStart ? undefined : engineTime(existing?.startedAt);
      if (containerId === "") {
        const gpu = task.gpuIds.length > 0 ? gpuContainerConfig(this.ctx.inventory, task.gpuIds) : undefined;
        const spec = buildContainerSpec({
          config: {
            ...task.config,
            image_name: formatPullReference(parseImageReference(task.config.image_name)),
          },
          containerName: task.containerName,
          runnerDir: TaskDirs.runnerDir(task.taskDir),
          params: this.ctx.params,
          gpu,
          owner: this.ctx.ownership.homeId,
        });
        try {
          containerId = await docker.createContainer(spec);
          await failpoint("after-create-before-persist");
        } catch (cause) {
          // A create that timed out may still have happened: adopt rather than duplicate.
          const adopted =
            cause instanceof DockerConflictError ? await this.findOwnContainer(task) : undefined;
          containerId = adopted?.id ?? "";
          needsStart = adopted?.state === "created";
          if (!needsStart) startedAt = engineTime(adopted?.startedAt);
          if (containerId === "") {
            throw new StartStepError(
              "creating_container_error",
              `createContainer error: ${errorMessage(cause)}`,
              {
                cause,
              },
            );
          }
        }
      }
      // Written with `running` below, not now: a restart before that finds the container by name
      // (a create answering 409 adopts it), so a write here would only lengthen the start.
      task = store.modify(id, (d) => (d.containerId = containerId));
      try {
        if (needsStart) {
          await docker.startContainer(containerId);
          startedAt = Date.now();
        }
      } catch (cause) {
        const logs = await docker.containerLogTail(containerId, LAST_LOG_LINES).catch(() => []);
        throw new StartStepError(
          "container_exited_with_error",
          logs.length > 0 ? logs.join("\n") : `startContainer error: ${errorMessage(cause)}`,
          { cause },
        );
      }
      await failpoint("after-start-before-persist");
      let ports: NonNullable<Task["ports"]> = [];
      if (task.config.network_mode === "bridge") {
        const details = await docker.inspectContainer(containerId).catch(() => undefined);
        ports = details?.ports ?? [];
        startedAt = engineTime(details?.startedAt) ?? startedAt;
      }
      // Visible once durable: a kill right after a read said `running` must not bring the task
      // back as `creating`, whose resumed start would re-create a container removed meanwhile.
      await this.commitVisibleWhenDurable(id, (d) => {
        d.ports = ports;
        d.startInFlight = false;
        if (startedAt !== undefined) d.startedAt = startedAt;
        d.status = "running";
      });
      this.ctx.observer?.taskStarted();
      log.info({ taskId: id, containerId }, "task running");
    });
  }

  /** A container of this task that already exists (by name, with our task label). */
  private async findOwnContainer(
    task: Task,
  ): Promise<{ id: string; state: ContainerState; startedAt: string } | undefined> {
    const candidate = await this.ctx.docker.inspectContainer(task.containerId ?? task.containerName);
    if (!candidate) return undefined;
    if (candidate.taskId !== task.id) {
      throw new StartStepError(
        "creating_container_error",
        `createContainer error: a container named ${task.containerName} exists and belongs to another task`,
      );
    }
    // The same task id under another home (the one ownership rule): never adopted.
    if (!this.ctx.ownership.isOurs(candidate, this.hasTaskState)) {
      throw new StartStepError(
        "creating_container_error",
        `createContainer error: a container named ${task.containerName} exists and belongs to another taskshim home`,
      );
    }
    return { id: candidate.id, state: candidate.state, startedAt: candidate.startedAt };
  }

  /**
   * The id of this task's container found by name (a task that never recorded one), or "" when
   * there is none or it is not ours: a container of that name under another home is left alone.
   */
  private async ownContainerIdByName(task: Task): Promise<string> {
    const candidate = await this.ctx.docker.inspectContainer(task.containerName);
    if (!candidate || candidate.taskId !== task.id) return "";
    return this.ctx.ownership.isOurs(candidate, this.hasTaskState) ? candidate.id : "";
  }

  /**
   * Whether a task id has a state here, as the ownership rule asks about a container without an
   * owner label. Its callers ask only about the task in hand (the container's task id was checked
   * to be that task's), which is in the store.
   */
  // Stryker disable next-line ConditionalExpression: both callers ask about the task they hold, which is in the store: the answer is always true
  private readonly hasTaskState = (taskId: string): boolean => this.ctx.store.get(taskId) !== undefined;

  /**
   * Makes every user's shim entries in authorized_keys the union of the live tasks' keys.
   * While a task whose keys are unknown (degraded) is alive, entries are only added.
   */
  reconcileHostKeys(extraUsers: readonly string[] = []): Promise<void> {
    const keepExisting = this.ctx.store
      .list()
      .some((t) => (t.degraded === true || t.foreign === true) && !t.cleanedUp && t.status !== "terminated");
    return this.ctx.hostKeys.reconcile(() => this.hostKeysByUser(extraUsers), { keepExisting });
  }

  /** The host keys every live task needs, per user (a terminated task needs none). */
  hostKeysByUser(extraUsers: readonly string[] = []): Map<string, string[]> {
    const byUser = new Map<string, string[]>(extraUsers.map((u) => [u, []]));
    for (const task of this.ctx.store.list()) {
      const live = !task.cleanedUp && task.status !== "terminated";
      if (!live || task.config.host_ssh_user === "" || task.config.host_ssh_keys.length === 0) continue;
      const keys = byUser.get(task.config.host_ssh_user) ?? [];
      keys.push(...task.config.host_ssh_keys);
      byUser.set(task.config.host_ssh_user, keys);
    }
    return byUser;
  }

  /**
   * Releases everything a task holds — volumes, host keys, GPUs — exactly once. The caller
   * holds the task lock and the container must not be running. `cleanedUp` is set in memory
   * first (so the task's keys leave the reconciled set) and persisted only after the release:
   * a crash in between re-runs the release, and each step is a no-op the second time.
   */
  async release(id: string): Promise<void> {
    const { store, volumes, gpuLock, log } = this.ctx;
    const task = store.get(id);
    // A task of a newer state format is read-only: its cleanup inputs are not ours to act on.
    if (!task || task.cleanedUp || task.foreign) return;
    store.modify(id, (d) => (d.cleanedUp = true));
    const problems: string[] = [];
    await deleteRegistryAuth(task.taskDir);
    await volumes.unmountVolumes(task.config.volumes).catch((e: unknown) => problems.push(errorMessage(e)));
    await failpoint("mid-release:volumes");
    if (task.config.host_ssh_keys.length > 0 && task.config.host_ssh_user !== "") {
      await this.reconcileHostKeys([task.config.host_ssh_user]).catch((e: unknown) =>
        problems.push(errorMessage(e)),
      );
    }
    await failpoint("mid-release:keys");
    const released = gpuLock.release(task.gpuIds);
    await failpoint("mid-release:gpus");
    if (store.get(id)) await this.commit(id, (d) => (d.gpuIds = []));
    if (problems.length > 0) log.error({ taskId: id, problems }, "task resources released with errors");
    else log.info({ taskId: id, gpus: released }, "task resources released");
  }

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
    const { store, docker, log } = this.ctx;
    const unlock = await store.lock(id);
    try {
      const before = store.mustGet(id);
      if (before.foreign) throw new TaskStateError(foreignMessage(id));
      const stopsFirst = before.status === "running" && before.containerId !== undefined;
      // The intent is durable before anything acts on it; if the home cannot take it, nothing
      // changed (the reconciler must never stop a container for a terminate the disk lacks).
      // A terminated task, or one whose intent is recorded, keeps its first reason.
      let task = before;
      if (before.status !== "terminated" && before.terminationReason === "") {
        task = await this.commitDurably(id, (d) => {
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
      this.pulls.get(id)?.abort(new Error(`terminated: ${task.terminationReason || reason}`));
      // A repeated terminate of a stopped container (exit code known) has nothing to stop.
      const alreadyStopped = before.status === "terminated" && before.exitCode !== undefined;
      if (task.containerId !== undefined && !alreadyStopped) {
        try {
          await docker.stopContainer(task.containerId, timeoutSeconds);
        } catch (cause) {
          // The intent stays recorded (a task still `running` stays so); the reconciler stops it.
          throw new TaskOperationError(`failed to stop container: ${errorMessage(cause)}`, { cause });
        }
        await failpoint("after-stop-before-persist");
        const details = await docker.inspectContainer(task.containerId).catch(() => undefined);
        const exited = details !== undefined && details.state !== "running" && details.state !== "created";
        if (stopsFirst) {
          // Only now `terminated`, with the reason recorded first. Visible at once: the intent
          // is already durable, so a crash before this write ends the same way after a restart.
          const finishedAt = exited ? engineTime(details.finishedAt) : undefined;
          const done = await this.commit(id, (d) => {
            d.status = "terminated";
            if (exited && d.exitCode === undefined) d.exitCode = details.exitCode;
            if (finishedAt !== undefined) d.finishedAt = finishedAt;
          });
          log.info(
            { taskId: id, reason: done.terminationReason, from: before.status, exitCode: done.exitCode },
            "task terminated",
          );
          this.ctx.observer?.taskFinalized(done.terminationReason);
        } else if (exited && task.exitCode === undefined) {
          await this.commit(id, (d) => (d.exitCode = details.exitCode));
        }
      }
      // A start in flight releases its own resources when it notices the terminate.
      if (!store.mustGet(id).startInFlight) await this.release(id);
      return store.mustGet(id);
    } finally {
      unlock();
    }
  }

  /** Removes a terminated task: its container (confirmed), its resources, its dir, its record. */
  async remove(id: string): Promise<void> {
    const { store, docker, dirs, log } = this.ctx;
    // A start overtaken by a terminate stops at its next step; let it hand its resources over
    // first, or a volume it is mounting right now would outlive the release below.
    if (store.mustGet(id).status === "terminated") await this.starts.get(id);
    const unlock = await store.lock(id);
    try {
      const task = store.mustGet(id);
      if (task.foreign) throw new TaskStateError(foreignMessage(id));
      if (task.status !== "terminated") {
        throw new TaskStateError(`cannot remove task ${id} with ${task.status} status`);
      }
      // The task dir must be writable before the container goes: a removal the disk cannot
      // follow would answer 200 and bring the task back at the next start.
      await this.commitDurably(id, () => undefined);
      try {
        const target = task.containerId ?? (await this.ownContainerIdByName(task));
        if (target !== "") await docker.removeContainer(target);
      } catch (cause) {
        throw new TaskOperationError(`failed to remove container task=${id}: ${errorMessage(cause)}`, {
          cause,
        });
      }
      await failpoint("after-container-remove");
      await this.release(id);
      store.delete(id);
      await this.persister.settle(id);
      // Stryker disable next-line CallExpression: only frees the entry; a removed task's unsynced id is skipped by persist and filtered out of unsyncedIds
      this.persister.forget(id);
      if (task.taskDir !== "") await dirs.remove(task.taskDir);
      log.info({ taskId: id }, "task removed");
    } finally {
      unlock();
    }
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

/**
 * The error that concerns `user` in a host keys reconcile failure: its own per-user error,
 * or the whole error when it is not a per-user one; undefined when only other users failed.
 */
function failureOfUser(error: unknown, user: string): Error | undefined {
  if (!(error instanceof AggregateError)) return error as Error;
  const perUser = error.errors.filter(
    (e): e is UserKeysReconcileError => e instanceof UserKeysReconcileError,
  );
  if (perUser.length !== error.errors.length) return error;
  return perUser.find((e) => e.user === user);
}
