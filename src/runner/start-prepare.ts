import { VolumePrepareInterruptedError } from "../host/volumes.js";
import type { Task } from "../tasks/task.js";
import { failpoint } from "./failpoints.js";
import type { RunnerContext } from "./runner-context.js";
import { checkStillWanted, StartAbandoned, startStep, StartStepError } from "./start-errors.js";
import type { TaskCommits } from "./task-commits.js";
import { failureOfUser, reconcileHostKeys } from "./task-host-keys.js";

/**
 * The first step of a start, on the host: the task's GPUs, its users' host keys, its volumes and
 * instance mounts, for the task as the start's `preparing` step left it. Each part is idempotent
 * (GPUs already held are kept), so a start cut by a restart prepares again.
 */
export async function prepareTask(ctx: RunnerContext, commits: TaskCommits, task: Task): Promise<void> {
  const { gpuLock, volumes } = ctx;
  const { id, config } = task;
  if (config.gpu !== 0 && task.gpuIds.length === 0) {
    const ids = await startStep("executor_error", undefined, () => gpuLock.acquire(config.gpu));
    await failpoint("after-gpu-acquire");
    // Committed at once, so a concurrent terminate or a failure releases exactly these. The
    // task is read again first, not taken from the snapshot: a terminate that landed during the
    // acquire ends the start here, and these GPUs go back to the lock.
    try {
      checkStillWanted(ctx.store, id);
      await commits.commit(id, (d) => (d.gpuIds = ids));
    } catch (error) {
      gpuLock.release(ids);
      throw error;
    }
  }
  if (config.host_ssh_keys.length > 0) {
    try {
      await reconcileHostKeys(ctx);
    } catch (cause) {
      // One user's broken ~/.ssh fails only that user's tasks: another user's failure is logged.
      const own = failureOfUser(cause, config.host_ssh_user);
      if (own) throw new StartStepError("executor_error", `host ssh keys: ${own.message}`, { cause: own });
      ctx.log.error({ taskId: id, err: cause }, "host ssh keys of other users not reconciled");
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
