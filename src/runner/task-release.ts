import { errorMessage } from "../errors/error-message.js";
import { failpoint } from "./failpoints.js";
import { deleteRegistryAuth } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import type { TaskCommits } from "./task-commits.js";
import { reconcileHostKeys } from "./task-host-keys.js";

/**
 * Releases everything a task holds — volumes, host keys, GPUs — exactly once. The caller
 * holds the task lock and the container must not be running. `cleanedUp` is set in memory
 * first (so the task's keys leave the reconciled set) and persisted only after the release
 * (`TaskCommits.markCleanedUp`): a crash in between re-runs the release, and each step is a
 * no-op the second time.
 */
export async function releaseTask(ctx: RunnerContext, commits: TaskCommits, id: string): Promise<void> {
  const { store, volumes, gpuLock, log } = ctx;
  const task = store.get(id);
  // A held task is read-only: its cleanup inputs are not ours to act on.
  if (!task || task.cleanedUp || task.held !== undefined) return;
  commits.markCleanedUp(id);
  const problems: string[] = [];
  await deleteRegistryAuth(task.taskDir);
  await volumes.unmountVolumes(task.config.volumes).catch((e: unknown) => problems.push(errorMessage(e)));
  await failpoint("mid-release:volumes");
  if (task.config.host_ssh_keys.length > 0 && task.config.host_ssh_user !== "") {
    await reconcileHostKeys(ctx, [task.config.host_ssh_user]).catch((e: unknown) =>
      problems.push(errorMessage(e)),
    );
  }
  await failpoint("mid-release:keys");
  const released = gpuLock.release(task.gpuIds);
  await failpoint("mid-release:gpus");
  if (store.get(id)) await commits.commit(id, (d) => (d.gpuIds = []));
  if (problems.length > 0) log.error({ taskId: id, problems }, "task resources released with errors");
  else log.info({ taskId: id, gpus: released }, "task resources released");
}
