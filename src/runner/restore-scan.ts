import { basename } from "node:path";
import { decodeStoredConfig } from "../state/stored-config.js";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import {
  TASK_STATE_VERSION,
  UnsupportedTaskStateVersionError,
  type NewerTaskStateView,
  type TaskState,
} from "../state/task-state-file.js";
import type { TaskHold } from "../tasks/task.js";
import { isValidTaskName } from "../tasks/task-config.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import type { RunnerContext } from "./runner-context.js";
import { errorMessage } from "../errors/error-message.js";

/*
 * The restore's first step: the scanned task dirs sorted into what is restored, what a newer
 * release wrote (shown, held, never written) and what is set aside in the quarantine.
 */

/** A state file the restore builds a task from: this version's, or what a newer one's shows. */
export interface StoredTask {
  readonly dir: string;
  readonly state: TaskState;
  /** Set for a task this version leaves alone (a newer release's). */
  readonly held?: TaskHold;
}

/** The scan sorted: what is restored, what is left alone, what was set aside. */
export interface SortedScan {
  /** Readable state files of this version, by task id (a newer release's status among them, held). */
  readonly states: Map<string, StoredTask>;
  /** A newer format's files: by task id when it could be read, by dir name (the container's) always. */
  readonly newer: { readonly byId: Map<string, StoredTask>; readonly byName: Map<string, StoredTask> };
  readonly quarantined: string[];
  readonly quarantineFailed: string[];
  readonly skippedNewer: string[];
}

const isTaskStatus = (value: string): value is TaskStatus =>
  (TASK_STATUSES as readonly string[]).includes(value);

/**
 * Sorts the scanned task dirs: this version's states are kept (a dir wider than 0700 was
 * narrowed: logged); a newer release's are left alone and their dirs held; anything unreadable
 * (bad JSON, a forged id, too large, a FIFO or a symlink) and any dir the shim does not enter (a
 * symlink, another user's) is moved to the quarantine with a note. A move that fails is reported
 * as failed, never as done, and the dir is held: nothing this version writes lands on it.
 */
export async function sortScanned(
  ctx: RunnerContext,
  scanned: readonly ScannedTaskDir[],
): Promise<SortedScan> {
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
