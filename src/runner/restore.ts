import { existsSync } from "node:fs";
import { basename, posix } from "node:path";
import pLimit from "p-limit";
import type { ContainerDetails, TaskContainerSummary } from "../docker/docker-client.js";
import { gpuIdsFromContainer } from "../docker/gpu-devices.js";
import { decodeStoredConfig } from "../state/stored-config.js";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import { epochOf, UnsupportedTaskStateVersionError, type TaskState } from "../state/task-state-file.js";
import { newTask, type Task } from "../tasks/task.js";
import { isValidVolumeName, type TaskConfig } from "../tasks/task-config.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { deleteRegistryAuth, REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import { errorMessage } from "../errors/error-message.js";

/** What startup found and did, for logs and metrics. */
export interface RestoreReport {
  readonly restored: number;
  /** Tasks whose start resumes (they had no running container yet). */
  readonly resumed: string[];
  /** State files renamed aside because they could not be read. */
  readonly quarantined: string[];
  /** State files held in `<home>/quarantine/` after its sweep (this start's and earlier ones). */
  readonly quarantineHeld: number;
  /** State files of a newer format: left alone, never deleted. */
  readonly skippedNewer: string[];
  /** Labelled containers without a task id label. */
  readonly ignoredContainers: string[];
  /** Labelled containers of another home (or claimed by nobody here): never acted on. */
  readonly foreignContainers: string[];
  /** Containers without owner label nor task state, adopted under `--adopt-unowned`. */
  readonly adoptedUnowned: string[];
  /** Leftover dirs deleted (never a dir with a state file). */
  readonly swept: string[];
  /** Tasks whose status was reconciled to something other than their task.json says: persist them. */
  readonly changed: string[];
  /** The engine's labelled list the restore was made from (the first reconcile tick reuses it). */
  readonly listed: readonly TaskContainerSummary[];
}

const PRE_CONTAINER: readonly TaskStatus[] = ["pending", "preparing", "pulling", "creating"];

/**
 * Rebuilds the in-memory tasks from Docker (what runs) and task.json (what was intended),
 * before the API serves. A task owns only the GPUs it newly locks here, so two restored
 * tasks can never both release the same GPU.
 */
export async function restoreTasks(ctx: RunnerContext): Promise<RestoreReport> {
  const { docker, dirs, store, gpuLock, log } = ctx;
  // The disk and the engine at once: the list's round trip hides behind the reads. Both end
  // before a failure is reported (the scan deletes temp files in the home).
  const reads = [dirs.scan(), docker.listTaskContainers(ctx.shutdown)] as const;
  await Promise.allSettled(reads);
  const [scanned, containers] = await Promise.all(reads);

  const states = new Map<string, { dir: string; state: TaskState }>();
  const quarantined: string[] = [];
  const skippedNewer: string[] = [];
  for (const entry of scanned) {
    if (entry.kind === "no-state") continue;
    if (entry.kind === "unreadable") {
      if (entry.error instanceof UnsupportedTaskStateVersionError) {
        log.warn({ dir: entry.dir, err: entry.error }, "task state of a newer format left alone");
        skippedNewer.push(entry.dir);
      } else {
        const target = await dirs.quarantine(entry.dir, errorMessage(entry.error)).catch((error: unknown) => {
          log.error(
            { dir: entry.dir, err: error },
            "corrupt task state could not be moved to the quarantine",
          );
          return entry.dir;
        });
        log.error(
          { dir: entry.dir, quarantinedAs: target, err: entry.error },
          "corrupt task state quarantined",
        );
        quarantined.push(target);
      }
      continue;
    }
    if (states.has(entry.state.id)) {
      log.error({ dir: entry.dir, taskId: entry.state.id }, "duplicate task state ignored");
      continue;
    }
    states.set(entry.state.id, { dir: entry.dir, state: entry.state });
  }

  const newerDirs = new Map(skippedNewer.map((dir) => [basename(dir), dir]));
  const ignoredContainers: string[] = [];
  const changed: string[] = [];
  const resumed: string[] = [];
  const adoptedUnowned: string[] = [];
  const byTask = new Map<string, TaskContainerSummary>();
  /** GPU id → the restored task that holds it. */
  const gpuHolders = new Map<string, string>();
  // The one ownership rule: another home's containers (and unclaimed ones) are not ours to act on.
  const hasTaskState = (taskId: string): boolean => states.has(taskId);
  const ours = ctx.ownership.filter(containers, hasTaskState);
  const foreignContainers = containers.filter((c) => !ours.includes(c)).map((c) => c.name);
  for (const container of ours) {
    if (container.taskId === "") {
      ignoredContainers.push(container.name);
      continue;
    }
    if (byTask.has(container.taskId)) {
      log.error(
        { taskId: container.taskId, container: container.name },
        "second container for one task ignored",
      );
      ignoredContainers.push(container.name);
      continue;
    }
    byTask.set(container.taskId, container);
  }

  // An inspect is made only where the list cannot tell: the GPUs a container holds (its
  // HostConfig, on a host with GPUs), its start time when task.json has none, its mounts for an
  // adoption without state, its ports when the client does not list them. On a host without GPUs
  // a restore of tasks with their state makes none (it was one per container, the bulk of the
  // restart after node's own start: BENCHMARKS.md, B3). Those made run a few at a time: 200
  // sequential round trips would hold the API back for seconds after a restart.
  const found = [...byTask.values()].filter((c) => needsInspect(ctx, c, states.get(c.taskId)?.state));
  const inspected = await pLimit(RESTORE_INSPECT_CONCURRENCY).map(found, (c) =>
    docker.inspectContainer(c.id, ctx.shutdown).catch(() => undefined),
  );
  const details = new Map(found.map((c, i) => [c.id, inspected[i]]));
  for (const [taskId, container] of byTask) {
    const stored = states.get(taskId);
    const inspect = details.get(container.id);
    const unowned = ctx.ownership.classify(container, hasTaskState) === "unowned-adopted";
    // Adopted without any state (--adopt-unowned): its volumes come from its mounts (dstack
    // #4220's fallback), its keys are unknown. It gets a task dir, so its release is recorded
    // once and never repeated by a later start.
    const config =
      stored?.state.config ?? legacyConfig(taskId, container, unowned ? recoveredVolumes(ctx, inspect) : []);
    let adoptedDir = "";
    if (unowned) {
      adoptedDir = await ctx.dirs.make(container.name).catch((error: unknown) => {
        log.error({ taskId, container: container.name, err: error }, "no task dir for an adopted container");
        return "";
      });
      adoptedUnowned.push(container.name);
      log.warn(
        { taskId, container: container.name, volumes: config.volumes.map((v) => v.name) },
        "container without owner label adopted (--adopt-unowned); its host keys are unknown",
      );
    }
    const cleanedUp = stored?.state.cleaned_up ?? false;
    const claimedGpus = cleanedUp ? [] : gpuIdsFromContainer(ctx.inventory, inspect?.hostConfig ?? undefined);
    const ownedGpus = gpuLock.lock(claimedGpus);
    for (const gpu of ownedGpus) gpuHolders.set(gpu, taskId);
    // Two containers that claim one GPU (made outside this shim): the first keeps it, this one is
    // flagged and not given it, so its release can never free the GPU of the task that holds it.
    const contested = claimedGpus.filter((gpu) => gpuHolders.has(gpu) && !ownedGpus.includes(gpu));
    if (contested.length > 0) {
      log.warn(
        { taskId, gpus: contested, heldBy: contested.map((gpu) => gpuHolders.get(gpu)) },
        "GPU claimed by two restored containers; left with the task that holds it",
      );
    }
    const reason = stored?.state.termination_reason ?? "";
    // A task whose start was cut before it committed `running` resumes and adopts its container.
    // A reason beside `running` is a terminate's intent whose stop a restart cut: the task stays
    // running until the reconciler has stopped its container, then ends with that reason.
    const status: TaskStatus =
      reason !== ""
        ? stored?.state.status === "running"
          ? "running"
          : "terminated"
        : stored?.state.status && PRE_CONTAINER.includes(stored.state.status) && container.state === "created"
          ? "creating"
          : "running";
    const foreignDir = stored ? undefined : newerDirs.get(container.name);
    const taskDir = stored?.dir ?? foreignDir ?? (adoptedDir || legacyDir(ctx, container.name));
    const keysUnknown = stored ? stored.state.keys_unknown === true : foreignDir === undefined;
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
      ...(foreignDir !== undefined ? { foreign: true } : {}),
      ...(keysUnknown ? { degraded: true } : {}),
      ...(container.state !== "created" && acrossReboot(ctx, stored?.state) ? { acrossReboot: true } : {}),
    });
    if (status === "creating") resumed.push(taskId);
    if (
      (unowned && adoptedDir !== "") ||
      (stored !== undefined && reordered) ||
      (stored?.state.status !== undefined && stored.state.status !== status)
    )
      changed.push(taskId);
  }

  for (const [taskId, { dir, state }] of states) {
    if (byTask.has(taskId)) continue;
    const reason = state.termination_reason;
    const persisted = state.status;
    let status: TaskStatus;
    if (reason !== "") status = "terminated";
    else if (persisted && PRE_CONTAINER.includes(persisted)) status = persisted;
    // It ran (or a dstack-shim wrote it): its container is gone. The reconciler finalizes it
    // as "container not found" with the exit code unknown.
    else status = "running";
    const reordered = add(ctx, {
      ...withTimes(newTask(state.config), state, undefined),
      status,
      terminationReason: reason,
      terminationMessage: state.termination_message,
      taskDir: dir,
      cleanedUp: state.cleaned_up,
      ...(state.exit_code !== undefined ? { exitCode: state.exit_code } : {}),
      ...(state.unknown_fields ? { unknownFields: state.unknown_fields } : {}),
      ...(!PRE_CONTAINER.includes(status) && acrossReboot(ctx, state) ? { acrossReboot: true } : {}),
    });
    if (PRE_CONTAINER.includes(status)) resumed.push(taskId);
    if (reordered) changed.push(taskId);
  }

  const quarantineHeld = await dirs.sweepQuarantine();
  await sweepCredentials(ctx, scanned, skippedNewer);
  // A foreign container's name keeps a dir of that name too: it may be another home's handover.
  const swept = await dirs.sweepLeftovers(new Set(containers.map((c) => c.name)));
  if (swept.length > 0) log.info({ swept }, "leftover task dirs swept");
  log.info(
    {
      restored: store.size,
      resumed: resumed.length,
      quarantined: quarantined.length,
      skippedNewer: skippedNewer.length,
      foreign: foreignContainers.length,
      adoptedUnowned: adoptedUnowned.length,
    },
    "tasks restored",
  );
  return {
    restored: store.size,
    resumed,
    quarantined,
    quarantineHeld,
    skippedNewer,
    ignoredContainers,
    foreignContainers,
    adoptedUnowned,
    swept,
    changed,
    listed: containers,
  };
}

const RESTORE_INSPECT_CONCURRENCY = 16;

/** Whether restoring this container needs what only an inspect reports (see restoreTasks). */
function needsInspect(
  ctx: RunnerContext,
  container: TaskContainerSummary,
  state: TaskState | undefined,
): boolean {
  if (state === undefined || container.ports === undefined) return true;
  if (ctx.inventory.vendor !== "none" && !state.cleaned_up) return true;
  return state.started_at === undefined && container.state !== "created";
}

/**
 * Registry credentials are kept only for a pull still to come: they are deleted from every
 * restored task past `creating` (a start, or a release, that could not delete them — a full
 * disk, a kill) and from every dir without a valid task.json (a submit cut or failed before
 * it). A dir of a newer format is left alone.
 */
async function sweepCredentials(
  ctx: RunnerContext,
  scanned: readonly ScannedTaskDir[],
  skippedNewer: readonly string[],
): Promise<void> {
  const newer = new Set(skippedNewer);
  const dirs = new Set<string>();
  for (const entry of scanned) if (entry.kind !== "state" && !newer.has(entry.dir)) dirs.add(entry.dir);
  for (const task of ctx.store.list()) {
    // Stryker disable next-line StringLiteral: a "" dir added is a no-op (deleteRegistryAuth returns at once for "").
    if (task.taskDir !== "" && !task.foreign && !PRE_CONTAINER.includes(task.status)) dirs.add(task.taskDir);
  }
  // The scan listed most of these dirs: only those that held the file are asked to delete it.
  const listed = new Map(scanned.map((entry) => [entry.dir, entry.names]));
  // Stryker disable next-line BooleanLiteral: a scanned dir lacks names only if it could not be listed (an I/O fault), and its unlink fails alike.
  const mayHold = (dir: string): boolean => listed.get(dir)?.includes(REGISTRY_AUTH_FILE) ?? true;
  // Stryker disable next-line MethodExpression: without the filter every dir is asked, and an absent file is ignored: the same result, 200 calls later.
  await pLimit(RESTORE_INSPECT_CONCURRENCY).map([...dirs].filter(mayHold), (dir) => deleteRegistryAuth(dir));
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

/**
 * A container created by a shim without task.json: only what the container itself tells. Read
 * as a stored config (the reader that restores every task.json, with the same zero values), not
 * through the submit validator, whose policy may refuse a label or a mount name: its task.json,
 * once written, reads back with the same id.
 */
function legacyConfig(
  taskId: string,
  container: TaskContainerSummary,
  volumes: readonly { readonly name: string; readonly path: string }[],
): TaskConfig {
  // A mount whose name the submit would refuse is not taken for a volume this task may release.
  const named = volumes.filter((v) => isValidVolumeName(v.name));
  return decodeStoredConfig({
    id: taskId,
    name: container.name.replace(/-[0-9a-f]{8}$/, "") || "task",
    image_name: "unknown",
    volumes: named.map((v) => ({ name: v.name })),
    volume_mounts: named.map((v) => ({ name: v.name, path: v.path })),
  });
}

/**
 * The network volumes a container uses, from its mounts: every mount whose host source is a
 * direct child of the volume mount root (where a shim mounts volumes) names one volume.
 */
export function recoveredVolumes(
  ctx: RunnerContext,
  inspect: ContainerDetails | undefined,
): { name: string; path: string }[] {
  const root = posix.normalize(ctx.params.volumeMountRoot);
  const found: { name: string; path: string }[] = [];
  for (const mount of inspect?.mounts ?? []) {
    const source = posix.normalize(mount.source);
    if (posix.dirname(source) !== root) continue;
    const name = posix.basename(source);
    if (name === "" || name.startsWith(".") || found.some((v) => v.name === name)) continue;
    found.push({ name, path: mount.destination });
  }
  return found;
}

function legacyDir(ctx: RunnerContext, containerName: string): string {
  try {
    const dir = ctx.dirs.dirFor(containerName);
    return existsSync(dir) ? dir : "";
  } catch {
    return "";
  }
}
