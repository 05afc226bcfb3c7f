import { buildContainerSpec } from "../docker/container-spec.js";
import { engineTime, type ContainerSpec } from "../docker/docker-client.js";
import { DockerConflictError } from "../docker/docker-errors.js";
import { gpuContainerConfig } from "../docker/gpu-devices.js";
import { errorMessage } from "../errors/error-message.js";
import { TaskDirs } from "../state/task-dirs.js";
import { formatPullReference, parseImageReference } from "../tasks/image-ref.js";
import type { Task } from "../tasks/task.js";
import { failpoint } from "./failpoints.js";
import { findOwnContainer } from "./own-container.js";
import { LAST_LOG_LINES, type RunnerContext } from "./runner-context.js";
import { DisplayRetryError, needsDisplayRetry, noteDisplayRetry } from "./nvidia-display-retry.js";
import { checkStillWanted, StartStepError } from "./start-errors.js";
import type { TaskCommits } from "./task-commits.js";

/**
 * The last steps of a start, for the task as its `creating` step left it: creates (or adopts)
 * the container and starts it, then commits `running`, holding the task lock so a terminate
 * either comes before (nothing is created) or after (it sees the container). Returns the task
 * as `running` left it.
 */
export async function createAndStart(
  ctx: RunnerContext,
  commits: TaskCommits,
  creating: Task,
): Promise<Task> {
  const { docker, store, log } = ctx;
  const { id } = creating;
  return store.withLock(id, async () => {
    // Read again under the lock, not taken from the snapshot: a terminate that took the lock
    // first must stop the start before anything is created. Nothing else the create reads
    // (config, dir, GPU ids, container id) changes while the start is in flight, so the
    // snapshot is handed on for those.
    checkStillWanted(store, id);
    let task = creating;
    // A task that never recorded a container is not looked up first: if a start cut by a
    // restart did create one, the create below answers 409 and that container is adopted.
    const existing = task.containerId !== undefined ? await findOwnContainer(ctx, task) : undefined;
    let containerId = existing?.id ?? "";
    // Only a container that never ran is started: one that runs or ran already (its start
    // request landed after a restart) is adopted as it is, and the reconciler takes it from there.
    let needsStart = existing === undefined || existing.state === "created";
    // When the container started: the engine's StartedAt where an inspect tells it (a container
    // adopted as it is, bridge mode's inspect below), else the time the start call returned.
    // Never the time `running` is committed: a slow write puts that after an instant exit.
    let startedAt = needsStart ? undefined : engineTime(existing?.startedAt);
    if (containerId === "") {
      try {
        containerId = await createContainer(ctx, task);
        await failpoint("after-create-before-persist");
      } catch (cause) {
        // A create that timed out may still have happened: adopt rather than duplicate.
        const adopted = cause instanceof DockerConflictError ? await findOwnContainer(ctx, task) : undefined;
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
    task = commits.inMemoryOnly(id, (d) => (d.containerId = containerId));
    try {
      if (needsStart) {
        try {
          await docker.startContainer(containerId);
        } catch (cause) {
          if (!needsDisplayRetry(ctx, task, cause)) throw cause;
          noteDisplayRetry(ctx, task, cause);
          containerId = await replaceWithoutDisplay(ctx, commits, task, containerId);
          task = commits.inMemoryOnly(id, (d) => (d.containerId = containerId));
          await docker.startContainer(containerId);
        }
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
    const running = await commits.commitVisibleWhenDurable(id, (d) => {
      d.ports = ports;
      d.startInFlight = false;
      if (startedAt !== undefined) d.startedAt = startedAt;
      d.status = "running";
    });
    ctx.observer?.taskStarted();
    log.info({ taskId: id, containerId }, "task running");
    return running;
  });
}

/**
 * Creates the task's container; a create the engine refuses for want of `/dev/nvidia-modeset` is
 * made again, once, without NVIDIA's display capability (`nvidia-display-retry.ts`).
 */
async function createContainer(ctx: RunnerContext, task: Task): Promise<string> {
  try {
    return await ctx.docker.createContainer(containerSpec(ctx, task, true));
  } catch (cause) {
    if (!needsDisplayRetry(ctx, task, cause)) throw cause;
    noteDisplayRetry(ctx, task, cause);
    return ctx.docker.createContainer(containerSpec(ctx, task, false));
  }
}

/**
 * The start failed for want of `/dev/nvidia-modeset` (nvidia-container-cli mounts it at start):
 * the container is removed, confirmed, and made again without NVIDIA's display capability, as
 * dstack-shim does. Returns the new container's id.
 *
 * @throws DisplayRetryError when the removal or the new create fails (its cause says why).
 */
async function replaceWithoutDisplay(
  ctx: RunnerContext,
  commits: TaskCommits,
  task: Task,
  containerId: string,
): Promise<string> {
  try {
    await ctx.docker.removeContainer(containerId);
  } catch (cause) {
    throw new DisplayRetryError(`remove container before retry: ${errorMessage(cause)}`, { cause });
  }
  // Until the new one exists the task names no container: a release then has nothing to stop.
  commits.inMemoryOnly(task.id, (d) => {
    delete d.containerId;
  });
  try {
    return await ctx.docker.createContainer(containerSpec(ctx, task, false));
  } catch (cause) {
    throw new DisplayRetryError(
      `create container without NVIDIA display capability: ${errorMessage(cause)}`,
      {
        cause,
      },
    );
  }
}

/**
 * The container a task runs in: its config with the image reference in its pull form, and
 * NVIDIA's display capability unless `nvidiaDisplay` is false.
 */
function containerSpec(ctx: RunnerContext, task: Task, nvidiaDisplay: boolean): ContainerSpec {
  const gpu =
    task.gpuIds.length > 0 ? gpuContainerConfig(ctx.inventory, task.gpuIds, { nvidiaDisplay }) : undefined;
  return buildContainerSpec({
    config: { ...task.config, image_name: formatPullReference(parseImageReference(task.config.image_name)) },
    containerName: task.containerName,
    runnerDir: TaskDirs.runnerDir(task.taskDir),
    params: ctx.params,
    gpu,
    owner: ctx.ownership.homeId,
  });
}
