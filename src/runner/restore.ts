import { basename } from "node:path";
import pLimit from "p-limit";
import type { ContainerDetails, TaskContainerSummary } from "../docker/docker-client.js";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import type { TaskState } from "../state/task-state-file.js";
import { isValidTaskId } from "../tasks/task-config.js";
import { failpoint } from "./failpoints.js";
import { sweepCredentials } from "./restore-credentials.js";
import { sortScanned, type StoredTask } from "./restore-scan.js";
import { restoreWithContainers, restoreWithoutContainers, type RestoredTally } from "./restored-task.js";
import type { RunnerContext } from "./runner-context.js";

/*
 * The restore in its steps: restoreTasks below, in order. The scan's sorting is in
 * restore-scan.ts, the tasks' building in restored-task.ts (what a container alone tells in
 * restore-legacy.ts), the credential sweep in restore-credentials.ts.
 */

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

/**
 * The restore's two reads, where the start began them before the restore (each is begun by the
 * restore when absent): the scan of the task dirs, begun under the home lock while the engine is
 * reached, and the engine's labelled list, begun once the engine is bound while the API is built
 * (src/shim/start-shim.ts). A read begun early must be settled by its own catch until awaited here.
 */
export interface RestoreReads {
  readonly scanning?: Promise<readonly ScannedTaskDir[]>;
  readonly listing?: Promise<readonly TaskContainerSummary[]>;
}

/**
 * Rebuilds the in-memory tasks from Docker (what runs) and task.json (what was intended),
 * before the API serves. A task owns only the GPUs it newly locks here, so two restored
 * tasks can never both release the same GPU.
 */
export async function restoreTasks(ctx: RunnerContext, begun: RestoreReads = {}): Promise<RestoreReport> {
  const { dirs, store, log } = ctx;
  const { scanned, containers } = await scanAndList(ctx, begun);
  await failpoint("mid-restore");

  const sorted = await sortScanned(ctx, scanned);
  const { quarantined, quarantineFailed, skippedNewer } = sorted;
  // The one ownership rule: another home's containers (and unclaimed ones) are not ours to act on.
  // A newer release's task.json is a task.json of that id all the same.
  const hasTaskState = (taskId: string): boolean =>
    sorted.states.has(taskId) || sorted.newer.byId.has(taskId);
  const ours = ctx.ownership.filter(containers, hasTaskState);
  const foreignContainers = containers.filter((c) => !ours.includes(c)).map((c) => c.name);
  const { byTask, ignoredContainers } = oneContainerPerTask(ctx, ours);
  const details = await inspectWhereNeeded(ctx, byTask, sorted.states);

  const tally: RestoredTally = { resumed: [], changed: [], adoptedUnowned: [] };
  await restoreWithContainers(ctx, { byTask, details, hasTaskState }, sorted, tally);
  restoreWithoutContainers(ctx, byTask, sorted, tally);
  const { resumed, changed, adoptedUnowned } = tally;

  const quarantineHeld = await dirs.sweepQuarantine();
  await sweepCredentials(ctx, scanned);
  // A foreign container's name keeps a dir of that name too: it may be another home's handover.
  // A dir whose task.json the scan read is no leftover either: kept without listing it again.
  const withState = [...sorted.states.values(), ...sorted.newer.byName.values()].map((s) => basename(s.dir));
  const swept = await dirs.sweepLeftovers(new Set([...containers.map((c) => c.name), ...withState]));
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

/**
 * The disk and the engine at once: the list's round trip hides behind the reads. Both end
 * before a failure is reported (the scan deletes temp files in the home).
 */
async function scanAndList(
  ctx: RunnerContext,
  { scanning, listing }: RestoreReads,
): Promise<{ scanned: readonly ScannedTaskDir[]; containers: readonly TaskContainerSummary[] }> {
  const reads = [
    scanning ?? ctx.dirs.scan(),
    listing ?? ctx.docker.listTaskContainers(ctx.shutdown),
  ] as const;
  await Promise.allSettled(reads);
  const [scanned, containers] = await Promise.all(reads);
  return { scanned, containers };
}

/**
 * Our containers by task id. A container whose label is no task id, and a second container of
 * one task, are ignored (their names reported).
 */
function oneContainerPerTask(
  ctx: RunnerContext,
  ours: readonly TaskContainerSummary[],
): { byTask: Map<string, TaskContainerSummary>; ignoredContainers: string[] } {
  const { log } = ctx;
  const ignoredContainers: string[] = [];
  const byTask = new Map<string, TaskContainerSummary>();
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
  return { byTask, ignoredContainers };
}

const RESTORE_INSPECT_CONCURRENCY = 16;

/**
 * An inspect is made only where the list cannot tell: the GPUs a container holds (its
 * HostConfig, on a host with GPUs), its start time when task.json has none, its mounts for an
 * adoption without state, its ports when the client does not list them. On a host without GPUs
 * a restore of tasks with their state makes none (it was one per container, the bulk of the
 * restart after node's own start: BENCHMARKS.md, B3). Those made run a few at a time: 200
 * sequential round trips would hold the API back for seconds after a restart. A failed inspect
 * is undefined: the task is restored from what the list tells.
 */
async function inspectWhereNeeded(
  ctx: RunnerContext,
  byTask: ReadonlyMap<string, TaskContainerSummary>,
  states: ReadonlyMap<string, StoredTask>,
): Promise<Map<string, ContainerDetails | undefined>> {
  const found = [...byTask.values()].filter((c) => needsInspect(ctx, c, states.get(c.taskId)?.state));
  const inspected = await pLimit(RESTORE_INSPECT_CONCURRENCY).map(found, (c) =>
    ctx.docker.inspectContainer(c.id, ctx.shutdown).catch(() => undefined),
  );
  return new Map(found.map((c, i) => [c.id, inspected[i]]));
}

/** Whether restoring this container needs what only an inspect reports (see inspectWhereNeeded). */
function needsInspect(
  ctx: RunnerContext,
  container: TaskContainerSummary,
  state: TaskState | undefined,
): boolean {
  if (state === undefined || container.ports === undefined) return true;
  if (ctx.inventory.vendor !== "none" && !state.cleaned_up) return true;
  return state.started_at === undefined && container.state !== "created";
}
