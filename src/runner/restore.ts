import { existsSync } from "node:fs";
import { basename, posix } from "node:path";
import pLimit from "p-limit";
import type { ContainerDetails, TaskContainerSummary } from "../docker/docker-client.js";
import { gpuIdsFromContainer } from "../docker/gpu-devices.js";
import { decodeStoredConfig } from "../state/stored-config.js";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import {
  epochOf,
  TASK_STATE_VERSION,
  UnsupportedTaskStateVersionError,
  type NewerTaskStateView,
  type TaskState,
} from "../state/task-state-file.js";
import { newTask, type Task, type TaskHold } from "../tasks/task.js";
import { isValidTaskId, isValidTaskName, isValidVolumeName, type TaskConfig } from "../tasks/task-config.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { failpoint } from "./failpoints.js";
import { deleteRegistryAuth, REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import type { RunnerContext } from "./runner-context.js";
import { errorMessage } from "../errors/error-message.js";

/** What startup found and did, for logs and metrics. */
export interface RestoreReport {
  readonly restored: number;
  /** Tasks whose start resumes (they had no running container yet). */
  readonly resumed: string[];
  /** State files (and task dirs) moved to the quarantine because they could not be read or entered. */
  readonly quarantined: string[];
  /** State files held in `<home>/quarantine/` after its sweep (this start's and earlier ones). */
  readonly quarantineHeld: number;
  /**
   * Unreadable state files and task dirs the shim does not enter whose move to the quarantine
   * failed: left where they are (their dirs held: never written by this release), by dir.
   */
  readonly quarantineFailed: string[];
  /** State files of a newer release (a newer format, or a status this version does not know): left alone, never deleted. */
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

const isTaskStatus = (value: string): value is TaskStatus =>
  (TASK_STATUSES as readonly string[]).includes(value);

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
  await failpoint("mid-restore");

  const { states, newer, quarantined, quarantineFailed, skippedNewer } = await sortScanned(ctx, scanned);
  const ignoredContainers: string[] = [];
  const changed: string[] = [];
  const resumed: string[] = [];
  const adoptedUnowned: string[] = [];
  const byTask = new Map<string, TaskContainerSummary>();
  /** GPU id → the restored task that holds it. */
  const gpuHolders = new Map<string, string>();
  // The one ownership rule: another home's containers (and unclaimed ones) are not ours to act on.
  // A newer release's task.json is a task.json of that id all the same.
  const hasTaskState = (taskId: string): boolean => states.has(taskId) || newer.byId.has(taskId);
  const ours = ctx.ownership.filter(containers, hasTaskState);
  const foreignContainers = containers.filter((c) => !ours.includes(c)).map((c) => c.name);
  for (const container of ours) {
    // A label that is not a task id (forged, or a bug) can never be a task of the API.
    if (container.taskId === "" || !isValidTaskId(container.taskId)) {
      if (container.taskId !== "") {
        log.warn({ container: container.name }, "container with an invalid task id label ignored");
      }
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
    const ownState = states.get(taskId);
    const newerState = ownState ? undefined : (newer.byId.get(taskId) ?? newer.byName.get(container.name));
    const stored = ownState ?? newerState;
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
    const claimedGpus = cleanedUp
      ? []
      : gpuIdsFromContainer(ctx.inventory, inspect?.hostConfig ?? undefined, inspect?.env);
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
    if (status === "creating") resumed.push(taskId);
    if (
      (unowned && adoptedDir !== "") ||
      (stored !== undefined && reordered) ||
      (stored?.state.status !== undefined && stored.state.status !== status)
    )
      changed.push(taskId);
  }

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
    if (PRE_CONTAINER.includes(status)) resumed.push(state.id);
    if (reordered) changed.push(state.id);
  }

  const quarantineHeld = await dirs.sweepQuarantine();
  await sweepCredentials(ctx, scanned);
  // A foreign container's name keeps a dir of that name too: it may be another home's handover.
  const swept = await dirs.sweepLeftovers(new Set(containers.map((c) => c.name)));
  if (swept.length > 0) log.info({ swept }, "leftover task dirs swept");
  log.info(
    {
      restored: store.size,
      resumed: resumed.length,
      quarantined: quarantined.length,
      ...(quarantineFailed.length > 0 ? { quarantineFailed: quarantineFailed.length } : {}),
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
    quarantineFailed,
    skippedNewer,
    ignoredContainers,
    foreignContainers,
    adoptedUnowned,
    swept,
    changed,
    listed: containers,
  };
}

/** A state file the restore builds a task from: this version's, or what a newer one's shows. */
interface StoredTask {
  readonly dir: string;
  readonly state: TaskState;
  /** Set for a task this version leaves alone (a newer release's). */
  readonly held?: TaskHold;
}

/** The scan sorted: what is restored, what is left alone, what was set aside. */
interface SortedScan {
  /** Readable state files of this version, by task id (a newer release's status among them, held). */
  readonly states: Map<string, StoredTask>;
  /** A newer format's files: by task id when it could be read, by dir name (the container's) always. */
  readonly newer: { readonly byId: Map<string, StoredTask>; readonly byName: Map<string, StoredTask> };
  readonly quarantined: string[];
  readonly quarantineFailed: string[];
  readonly skippedNewer: string[];
}

/**
 * Sorts the scanned task dirs: this version's states are kept (a dir wider than 0700 was
 * narrowed: logged); a newer release's are left alone and their dirs held; anything unreadable
 * (bad JSON, a forged id, too large, a FIFO or a symlink) and any dir the shim does not enter (a
 * symlink, another user's) is moved to the quarantine with a note. A move that fails is reported
 * as failed, never as done, and the dir is held: nothing this version writes lands on it.
 */
async function sortScanned(ctx: RunnerContext, scanned: readonly ScannedTaskDir[]): Promise<SortedScan> {
  const { dirs, log } = ctx;
  const sorted: SortedScan = {
    states: new Map(),
    newer: { byId: new Map(), byName: new Map() },
    quarantined: [],
    quarantineFailed: [],
    skippedNewer: [],
  };
  /** Moves what cannot be used aside; `cause` says why (a read error, or why a dir is not entered). */
  const setAside = async (dir: string, cause: Error | string, what: "file" | "dir"): Promise<void> => {
    const reason = typeof cause === "string" ? cause : errorMessage(cause);
    const why = typeof cause === "string" ? { reason } : { reason, err: cause };
    try {
      const target =
        what === "file" ? await dirs.quarantine(dir, reason) : await dirs.quarantineDir(dir, reason);
      log.error(
        { dir, quarantinedAs: target, ...why },
        what === "file" ? "corrupt task state quarantined" : "task dir quarantined",
      );
      sorted.quarantined.push(target);
    } catch (error) {
      // Reported as what it is: nothing was moved. The dir is held so that no later write of
      // this release (a submit, a terminate) lands on the evidence.
      log.error(
        { dir, ...why, quarantineError: errorMessage(error) },
        what === "file"
          ? "corrupt task state could not be quarantined: left in place and never written, until a human moves it"
          : "task dir could not be quarantined: left in place and never written, until a human moves it",
      );
      dirs.hold(dir, { kind: "unquarantined", reason: errorMessage(error) });
      sorted.quarantineFailed.push(dir);
    }
  };
  for (const entry of scanned) {
    if (entry.narrowedFrom !== undefined) {
      const mode = `0${entry.narrowedFrom.toString(8)}`;
      if (entry.narrowError === undefined) {
        log.warn({ dir: entry.dir, mode }, "task dir was wider than 0700; narrowed to 0700");
      } else {
        log.error(
          { dir: entry.dir, mode, error: entry.narrowError },
          "task dir is wider than 0700 and could not be narrowed",
        );
      }
    }
    if (entry.kind === "no-state") continue;
    if (entry.kind === "unsafe") {
      await setAside(entry.dir, `task dir not entered: ${entry.why}`, "dir");
      continue;
    }
    if (entry.kind === "unreadable") {
      if (entry.error instanceof UnsupportedTaskStateVersionError) {
        log.warn({ dir: entry.dir, err: entry.error }, "task state of a newer format left alone");
        sorted.skippedNewer.push(entry.dir);
        const { view, version } = entry.error;
        const hold: TaskHold = {
          kind: "newer-format",
          version: Number(version),
          ...(view?.status !== undefined ? { status: view.status } : {}),
        };
        dirs.hold(entry.dir, hold);
        const shown: StoredTask = { dir: entry.dir, state: newerState(view, entry.dir), held: hold };
        sorted.newer.byName.set(basename(entry.dir), shown);
        if (view !== undefined && !sorted.newer.byId.has(view.id)) sorted.newer.byId.set(view.id, shown);
      } else {
        await setAside(entry.dir, entry.error, "file");
      }
      continue;
    }
    const { state } = entry;
    if (sorted.states.has(state.id)) {
      log.error({ dir: entry.dir, taskId: state.id }, "duplicate task state ignored");
      continue;
    }
    if (state.unknown_status !== undefined) {
      // A newer release's status in this format (its pending task, say): never finalized,
      // resumed or released here, and its file never rewritten.
      log.warn(
        { dir: entry.dir, taskId: state.id, status: state.unknown_status },
        "task state with a newer release's status left alone",
      );
      sorted.skippedNewer.push(entry.dir);
      const hold: TaskHold = { kind: "newer-status", status: state.unknown_status };
      dirs.hold(entry.dir, hold);
      sorted.states.set(state.id, { dir: entry.dir, state, held: hold });
      continue;
    }
    sorted.states.set(state.id, { dir: entry.dir, state });
  }
  return sorted;
}

/**
 * A newer release's file as a state of this version, to show it: what could be read, with the
 * dir's name standing in for a name it lacks and `unknown` for its image. Without a view (no
 * valid id) it only stands for its dir, matched to a container by name.
 */
function newerState(view: NewerTaskStateView | undefined, dir: string): TaskState {
  const stem = basename(dir).replace(/-[0-9a-f]{8}$/, "");
  const id = view?.id ?? "";
  const known = view?.status !== undefined && isTaskStatus(view.status) ? { status: view.status } : {};
  return {
    version: TASK_STATE_VERSION,
    id,
    config: decodeStoredConfig({
      id: id || "unknown",
      name: view?.name ?? (isValidTaskName(stem) ? stem : "task"),
      image_name: view?.image_name ?? "unknown",
    }),
    termination_reason: (view?.termination_reason ?? "") as TerminationReason | "",
    termination_message: view?.termination_message ?? "",
    // Its cleanup inputs are the newer release's: a restored container's GPUs are locked all the same.
    cleaned_up: false,
    // Its keys are known to the newer release only: entries are kept while it lives.
    keys_unknown: false,
    ...known,
    ...(view?.exit_code !== undefined ? { exit_code: view.exit_code } : {}),
    ...(view?.created_at !== undefined ? { created_at: view.created_at } : {}),
    ...(view?.started_at !== undefined ? { started_at: view.started_at } : {}),
    ...(view?.finished_at !== undefined ? { finished_at: view.finished_at } : {}),
  };
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
 * it). A held dir (a newer release's, or evidence) and a dir the shim does not enter are left
 * alone.
 */
async function sweepCredentials(ctx: RunnerContext, scanned: readonly ScannedTaskDir[]): Promise<void> {
  const dirs = new Set<string>();
  for (const entry of scanned) {
    if (entry.kind !== "state" && entry.kind !== "unsafe" && ctx.dirs.heldBy(entry.dir) === undefined)
      dirs.add(entry.dir);
  }
  for (const task of ctx.store.list()) {
    // Stryker disable next-line StringLiteral: a "" dir added is a no-op (deleteRegistryAuth returns at once for "").
    if (task.taskDir !== "" && task.held === undefined && !PRE_CONTAINER.includes(task.status))
      dirs.add(task.taskDir);
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
  // A name its task.json could not be read back with (a very long container name) is not kept.
  const stem = container.name.replace(/-[0-9a-f]{8}$/, "");
  return decodeStoredConfig({
    id: taskId,
    name: isValidTaskName(stem) ? stem : "task",
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
