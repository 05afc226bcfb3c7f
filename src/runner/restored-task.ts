import { basename } from "node:path";
import type { ContainerDetails, TaskContainerSummary } from "../docker/docker-client.js";
import { gpuIdsFromContainer } from "../docker/gpu-devices.js";
import { epochOf, type TaskState } from "../state/task-state-file.js";
import { newTask, type Task } from "../tasks/task.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { legacyConfig, legacyDir, recoveredVolumes } from "./restore-legacy.js";
import type { SortedScan, StoredTask } from "./restore-scan.js";
import type { RunnerContext } from "./runner-context.js";

/*
 * The restore's tasks, built from what the scan and the engine found: one per container that is
 * ours, then one per task.json whose container is gone. Each goes into the store as it is built.
 */

/** The statuses of a start that has made no running container yet: such a start resumes. */
export const PRE_CONTAINER: readonly TaskStatus[] = ["pending", "preparing", "pulling", "creating"];

/** What building the tasks found to report, each list in the order the tasks were built. */
export interface RestoredTally {
  /** Tasks whose start resumes (they had no running container yet). */
  readonly resumed: string[];
  /** Tasks whose status was reconciled to something other than their task.json says: persist them. */
  readonly changed: string[];
  /** Containers without owner label nor task state, adopted under `--adopt-unowned`. */
  readonly adoptedUnowned: string[];
}

/** The containers that are ours, one per task, with what an inspect told where one was needed. */
export interface FoundContainers {
  readonly byTask: ReadonlyMap<string, TaskContainerSummary>;
  /** By container id: absent where no inspect was needed, undefined where it failed. */
  readonly details: ReadonlyMap<string, ContainerDetails | undefined>;
  /** Whether a task id has a task.json (this version's or a newer one's): the ownership rule's question. */
  readonly hasTaskState: (taskId: string) => boolean;
}

/**
 * Adds a task for each container, with its task.json when it has one. A task owns only the GPUs
 * it newly locks here, so two restored tasks can never both release the same GPU.
 */
export async function restoreWithContainers(
  ctx: RunnerContext,
  found: FoundContainers,
  sorted: SortedScan,
  tally: RestoredTally,
): Promise<void> {
  const { dirs, log } = ctx;
  const { states, newer } = sorted;
  const { byTask, details, hasTaskState } = found;
  /** GPU id → the restored task that holds it. */
  const gpuHolders = new Map<string, string>();
  for (const [taskId, container] of byTask) {
    const ownState = states.get(taskId);
    const newerState = ownState ? undefined : (newer.byId.get(taskId) ?? newer.byName.get(container.name));
    const stored = ownState ?? newerState;
    const inspect = details.get(container.id);
    const unowned = ctx.ownership.classify(container, hasTaskState) === "unowned-adopted";
    // Adopted without any state (--adopt-unowned): its volumes come from its mounts (as dstack's
    // own shim recovers them), its keys are unknown. It gets a task dir, so its release is
    // recorded once and never repeated by a later start.
    const config =
      stored?.state.config ?? legacyConfig(taskId, container, unowned ? recoveredVolumes(ctx, inspect) : []);
    let adoptedDir = "";
    if (unowned) {
      adoptedDir = await ctx.dirs.make(container.name).catch((error: unknown) => {
        log.error({ taskId, container: container.name, err: error }, "no task dir for an adopted container");
        return "";
      });
      tally.adoptedUnowned.push(container.name);
      log.warn(
        { taskId, container: container.name, volumes: config.volumes.map((v) => v.name) },
        "container without owner label adopted (--adopt-unowned); its host keys are unknown",
      );
    }
    const cleanedUp = stored?.state.cleaned_up ?? false;
    const claimedGpus = cleanedUp
      ? []
      : gpuIdsFromContainer(ctx.inventory, inspect?.hostConfig ?? undefined, inspect?.env);
    const ownedGpus = lockGpus(ctx, taskId, claimedGpus, gpuHolders);
    const reason = stored?.state.termination_reason ?? "";
    const status = containerTaskStatus(stored, container);
    const taskDir = stored?.dir ?? (adoptedDir || legacyDir(ctx, container.name));
    // Held: a newer release's, or a dir whose unreadable state file could not be quarantined.
    const held = stored?.held ?? (taskDir !== "" ? dirs.heldBy(taskDir) : undefined);
    const keysUnknown = stored ? stored.state.keys_unknown === true : held === undefined;
    const reordered = add(ctx, {
      ...withTimes(newTask(config), stored?.state, inspect?.startedAt),
      id: taskId,
      status,
      terminationReason: reason,
      terminationMessage: stored?.state.termination_message ?? "",
      containerName: container.name,
      containerId: container.id,
      ...(container.state === "created" ? {} : { ports: inspect?.ports ?? container.ports ?? [] }),
      gpuIds: ownedGpus,
      taskDir,
      cleanedUp,
      ...(stored?.state.exit_code !== undefined ? { exitCode: stored.state.exit_code } : {}),
      ...(stored?.state.unknown_fields ? { unknownFields: stored.state.unknown_fields } : {}),
      ...(held !== undefined ? { held } : {}),
      ...(keysUnknown ? { degraded: true } : {}),
      ...(container.state !== "created" && acrossReboot(ctx, stored?.state) ? { acrossReboot: true } : {}),
    });
    if (held !== undefined) continue;
    if (status === "creating") tally.resumed.push(taskId);
    if (
      (unowned && adoptedDir !== "") ||
      (stored !== undefined && reordered) ||
      (stored?.state.status !== undefined && stored.state.status !== status)
    )
      tally.changed.push(taskId);
  }
}

/**
 * Locks the GPUs a container claims and returns those this task now owns. Two containers that
 * claim one GPU (made outside this shim): the first keeps it, this one is flagged and not given
 * it, so its release can never free the GPU of the task that holds it.
 */
function lockGpus(
  ctx: RunnerContext,
  taskId: string,
  claimedGpus: readonly string[],
  gpuHolders: Map<string, string>,
): string[] {
  const ownedGpus = ctx.gpuLock.lock(claimedGpus);
  for (const gpu of ownedGpus) gpuHolders.set(gpu, taskId);
  const contested = claimedGpus.filter((gpu) => gpuHolders.has(gpu) && !ownedGpus.includes(gpu));
  if (contested.length > 0) {
    ctx.log.warn(
      { taskId, gpus: contested, heldBy: contested.map((gpu) => gpuHolders.get(gpu)) },
      "GPU claimed by two restored containers; left with the task that holds it",
    );
  }
  return ownedGpus;
}

/**
 * The status of a task whose container is there. A task whose start was cut before it committed
 * `running` resumes and adopts its container. A reason beside `running` is a terminate's intent
 * whose stop a restart cut: the task stays running until the reconciler has stopped its
 * container, then ends with that reason.
 */
function containerTaskStatus(stored: StoredTask | undefined, container: TaskContainerSummary): TaskStatus {
  const reason = stored?.state.termination_reason ?? "";
  return reason !== ""
    ? stored?.state.status === "running"
      ? "running"
      : "terminated"
    : stored?.state.status && PRE_CONTAINER.includes(stored.state.status) && container.state === "created"
      ? "creating"
      : "running";
}

/**
 * Adds a task for each task.json whose container is gone (or never was), a newer release's
 * among them; a newer format's file of a task id this version's file also has is ignored.
 */
export function restoreWithoutContainers(
  ctx: RunnerContext,
  byTask: ReadonlyMap<string, TaskContainerSummary>,
  sorted: SortedScan,
  tally: RestoredTally,
): void {
  const { log } = ctx;
  const { states, newer } = sorted;
  const withoutContainer = [...states.values(), ...newer.byId.values()];
  for (const { dir, state, held } of withoutContainer) {
    if (byTask.has(state.id)) continue;
    if (held?.kind === "newer-format" && states.has(state.id)) {
      log.error({ dir, taskId: state.id }, "duplicate task state ignored");
      continue;
    }
    const reason = state.termination_reason;
    const persisted = state.status;
    let status: TaskStatus;
    if (held !== undefined) status = heldStatus(state);
    else if (reason !== "") status = "terminated";
    else if (persisted && PRE_CONTAINER.includes(persisted)) status = persisted;
    // It ran (or a dstack-shim wrote it): its container is gone. The reconciler finalizes it
    // as "container not found" with the exit code unknown.
    else status = "running";
    const reordered = add(ctx, {
      ...withTimes(newTask(state.config), state, undefined),
      ...(held !== undefined ? { containerName: basename(dir) } : {}),
      status,
      terminationReason: reason,
      terminationMessage: state.termination_message,
      taskDir: dir,
      cleanedUp: state.cleaned_up,
      ...(state.exit_code !== undefined ? { exitCode: state.exit_code } : {}),
      ...(state.unknown_fields ? { unknownFields: state.unknown_fields } : {}),
      ...(held !== undefined ? { held } : {}),
      ...(!PRE_CONTAINER.includes(status) && acrossReboot(ctx, state) ? { acrossReboot: true } : {}),
    });
    if (held !== undefined) continue;
    if (PRE_CONTAINER.includes(status)) tally.resumed.push(state.id);
    if (reordered) tally.changed.push(state.id);
  }
}

/**
 * The status a held task without a container is shown in: the one its file holds when this
 * version knows it, else `terminated` with a reason and `pending` without (the wire's statuses
 * are dstack-shim's; the file's own is in the answer's `held`).
 */
function heldStatus(state: TaskState): TaskStatus {
  if (state.status !== undefined) return state.status;
  return state.termination_reason !== "" ? "terminated" : "pending";
}

/**
 * The state was last written during an earlier boot of this host. Only a container that ran
 * then can have been ended by the reboot: a start resumed now (no container yet, or one only
 * `created`) runs in this boot, and its exit is its own.
 */
function acrossReboot(ctx: RunnerContext, state: TaskState | undefined): boolean {
  return state?.boot_id !== undefined && state.boot_id !== ctx.bootId;
}

/**
 * The task's times from its state file (a file written before they existed has none: unknown,
 * not "now"); the start time falls back to the container's own.
 */
function withTimes(task: Task, state: TaskState | undefined, containerStartedAt: string | undefined): Task {
  const { createdAt: _now, startedAt: _s, finishedAt: _f, ...rest } = task;
  const createdAt = epochOf(state?.created_at);
  const startedAt = epochOf(state?.started_at) ?? epochOf(containerStartedAt);
  const finishedAt = epochOf(state?.finished_at);
  return {
    ...rest,
    ...(createdAt !== undefined ? { createdAt } : {}),
    // Docker reports a never-started container's StartedAt as year 1.
    ...(startedAt !== undefined && startedAt > 0 ? { startedAt } : {}),
    ...(finishedAt !== undefined ? { finishedAt } : {}),
  };
}

/**
 * Adds a restored task; true when the store put its times in order (an older release stamped
 * them out of order): such a task is persisted, so every later reader — a rolled-back release
 * included — sees the same times.
 */
function add(ctx: RunnerContext, task: Task): boolean {
  try {
    const added = ctx.store.add(task);
    return (
      added.createdAt !== task.createdAt ||
      added.startedAt !== task.startedAt ||
      added.finishedAt !== task.finishedAt
    );
  } catch (error) {
    ctx.gpuLock.release(task.gpuIds);
    ctx.log.error({ taskId: task.id, err: error }, "task not restored");
    return false;
  }
}
