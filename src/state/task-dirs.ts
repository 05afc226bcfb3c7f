import { lstatSync, readdirSync, readlinkSync, unlinkSync, type Dirent, type Stats } from "node:fs";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import { chmod, lstat, mkdir, readdir, rename, rm } from "node:fs/promises";
import { dirname, join, relative, resolve, sep } from "node:path";
import pLimit from "p-limit";
import type { TaskHold } from "../tasks/task.js";
import { syncDirectory, tempFilePrefix } from "./durable-write.js";
import { describeFsError } from "./log-file-sink.js";
import { quarantineStateFile, quarantineTaskDir, sweepQuarantine } from "./quarantine.js";
import { readTaskState, TASK_STATE_FILE, type TaskState } from "./task-state-file.js";
import { VERSION } from "../version.js";

/** The subdir of a task dir that is bind-mounted into the container as /tmp/runner. */
export const RUNNER_SUBDIR = "runner";

/**
 * A task dir found at startup, with its state or the reason it could not be read, and the names
 * it held once its stale temp files were deleted (`undefined` when it could not be listed), so
 * that what the restore looks for in it costs no further call. An `unsafe` entry is one the shim
 * does not enter: a symlink (never followed) or a dir another user owns; `narrowedFrom` is the
 * mode of a dir that was wider than 0700 and has been narrowed to it, or that could not be
 * (`narrowError`: a read-only home, say; the scan goes on).
 */
export type ScannedTaskDir = (
  | { readonly kind: "state"; readonly dir: string; readonly state: TaskState }
  | { readonly kind: "unreadable"; readonly dir: string; readonly error: Error }
  | { readonly kind: "no-state"; readonly dir: string }
  | { readonly kind: "unsafe"; readonly dir: string; readonly why: string }
) & {
  readonly names: readonly string[] | undefined;
  readonly narrowedFrom?: number;
  readonly narrowError?: string;
};

/** A path would leave the tasks dir, or is not a dir of the shim's own. */
export class UnsafeTaskDirError extends Error {
  override readonly name = "UnsafeTaskDirError";
}

/** A task dir this version must not write into (see `TaskHold`); nothing was written. */
export class HeldTaskDirError extends Error {
  override readonly name = "HeldTaskDirError";
  constructor(
    readonly dir: string,
    readonly hold: TaskHold,
  ) {
    super(`task dir ${dir} is held (${hold.kind}): this release does not write into it`);
  }
}

/** The shim's own uid: a task dir of another owner is not entered. */
const ownUid = (): number | undefined => process.getuid?.();

/**
 * The `<home>/runners` tree: one private dir (0700) per task named after its container,
 * holding task.json and pull.log, and a `runner/` subdir (0755) that is the only part the
 * container sees (dstack-shim #4223 layout).
 */
export class TaskDirs {
  readonly root: string;
  /** Dirs this version must not write into, by path: what a restore found held. */
  private readonly holds = new Map<string, TaskHold>();

  constructor(home: string) {
    this.root = resolve(home, "runners");
  }

  /** The task dir for a container name, refusing anything that escapes the root. */
  dirFor(containerName: string): string {
    const dir = resolve(this.root, containerName);
    const rel = relative(this.root, dir);
    if (
      rel === "" ||
      rel !== containerName ||
      // Stryker disable next-line MethodExpression: redundant with the dot check below, kept for clarity.
      rel.startsWith("..") ||
      rel.includes(sep) ||
      containerName.startsWith(".")
    ) {
      throw new UnsafeTaskDirError(`refusing task dir name ${JSON.stringify(containerName)}`);
    }
    return dir;
  }

  /** The mounted runner subdir of a task dir. */
  static runnerDir(taskDir: string): string {
    return join(taskDir, RUNNER_SUBDIR);
  }

  /**
   * Marks a dir this version must never write into: a newer release's task, or a state file that
   * could not be quarantined. `make` refuses it from then on.
   */
  hold(dir: string, hold: TaskHold): void {
    this.holds.set(dir, hold);
  }

  /** Why a dir is held, or undefined. */
  heldBy(dir: string): TaskHold | undefined {
    return this.holds.get(dir);
  }

  /**
   * Creates (idempotently) the task dir and its dstack-runner subdir, durably. A held dir is
   * refused (`HeldTaskDirError`), and so is one that is a symlink or another user's
   * (`UnsafeTaskDirError`): nothing is written through it.
   */
  async make(containerName: string): Promise<string> {
    const dir = this.dirFor(containerName);
    const hold = this.holds.get(dir);
    if (hold !== undefined) throw new HeldTaskDirError(dir, hold);
    await mkdir(this.root, { recursive: true, mode: 0o755 });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const made = await lstat(dir);
    const uid = ownUid();
    if (!made.isDirectory() || (uid !== undefined && made.uid !== uid)) {
      throw new UnsafeTaskDirError(
        `refusing task dir ${dir}: ${made.isDirectory() ? `owned by uid ${made.uid}` : "not a directory"}`,
      );
    }
    await chmod(dir, 0o700);
    await mkdir(TaskDirs.runnerDir(dir), { recursive: true, mode: 0o755 });
    // The umask may have narrowed it; a non-root container user must still enter it.
    await chmod(TaskDirs.runnerDir(dir), 0o755);
    await syncDirectory(this.root);
    return dir;
  }

  /**
   * Deletes a task dir; if that fails (a busy mount, EPERM), renames it out of the way to
   * `.trash-<name>-<micros>` so the name can be reused.
   */
  async remove(dir: string): Promise<void> {
    try {
      // Stryker disable next-line BooleanLiteral: force only matters for a missing dir, and the fallback's rename of a missing dir fails into the same quiet end.
      await rm(dir, { recursive: true, force: true });
    } catch {
      const name = relative(this.root, dir);
      await rename(dir, join(this.root, `.trash-${name}-${Date.now() * 1000}`)).catch(() => undefined);
    }
    await syncDirectory(this.root).catch(() => undefined);
  }

  /**
   * Scans every non-dot subdir of the root once; stale temp files are deleted on the way. A
   * symlink there is never followed and a dir of another user never entered (both `unsafe`); a
   * dir wider than 0700 is narrowed to it (`narrowedFrom`). Every task.json is read bounded in
   * size and type (`readTaskState`).
   *
   * By synchronous calls, dir after dir, yielding to the event loop whenever
   * {@link SCAN_SLICE_MS} have passed: a restart reads every dir before it serves, and on a warm
   * page cache a synchronous call costs a few microseconds where a round trip through libuv's
   * thread pool costs tens (200 dirs: ~12 ms against ~50 ms cold, BENCHMARKS.md). The yields keep
   * the start's signals and the engine's answers waiting a slice at most, unless one call is
   * itself slow: a read stuck in the kernel holds the loop until it returns. `sliceMs`: for tests.
   */
  async scan(sliceMs = SCAN_SLICE_MS): Promise<ScannedTaskDir[]> {
    let entries: Dirent[];
    try {
      entries = readdirSync(this.root, { withFileTypes: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw error;
    }
    const scanned: ScannedTaskDir[] = [];
    let sliceFrom = performance.now();
    for (const entry of entries) {
      if ((!entry.isDirectory() && !entry.isSymbolicLink()) || entry.name.startsWith(".")) continue;
      const found = this.scanOne(join(this.root, entry.name));
      scanned.push(found.narrowedFrom === undefined ? found : await narrowed(found));
      if (performance.now() - sliceFrom >= sliceMs) {
        await yieldToLoop();
        sliceFrom = performance.now();
      }
    }
    return scanned;
  }

  private scanOne(dir: string): ScannedTaskDir {
    let seen: Stats;
    try {
      seen = lstatSync(dir);
    } catch {
      // Gone since the listing: nothing to restore.
      return { kind: "no-state", dir, names: [] };
    }
    if (seen.isSymbolicLink()) {
      return {
        kind: "unsafe",
        dir,
        why: `it is a symbolic link (to ${readLinkOr(dir, "?")}), not a directory`,
        names: undefined,
      };
    }
    if (!seen.isDirectory()) return { kind: "no-state", dir, names: [] };
    const uid = ownUid();
    if (uid !== undefined && seen.uid !== uid) {
      return {
        kind: "unsafe",
        dir,
        why: `it is owned by uid ${seen.uid}, not the shim's (${uid})`,
        names: undefined,
      };
    }
    const mode = seen.mode & 0o7777;
    // Wider than 0700 (a chmod by hand, an older release): another user could read credentials.
    // Narrowed by the scan once this dir is read (`narrowed`).
    const wide = (mode & 0o7077) !== 0 ? { narrowedFrom: mode } : {};
    const names = this.sweepTempFiles(dir);
    // Listed without a task.json: nothing to read (a restart reads every dir).
    // Stryker disable next-line ConditionalExpression: without the shortcut the read fails with ENOENT, giving the same no-state one call later.
    if (names !== undefined && !names.includes(TASK_STATE_FILE))
      return { kind: "no-state", dir, names, ...wide };
    try {
      return { kind: "state", dir, state: readTaskState(dir), names, ...wide };
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      // Stryker disable next-line ConditionalExpression,StringLiteral: reached only by a dir that could not be listed, or whose task.json vanished after its listing: neither can be staged.
      return code === "ENOENT"
        ? { kind: "no-state", dir, names, ...wide }
        : { kind: "unreadable", dir, error: error as Error, names, ...wide };
    }
  }

  /**
   * Deletes what can never belong to a task again: `.trash-*` dirs left by a failed delete,
   * and dirs holding nothing but an empty `runner/` (a submit cut before its first task.json).
   * Dirs named in `keep` (a container still uses them) are left alone.
   */
  async sweepLeftovers(keep: ReadonlySet<string>): Promise<string[]> {
    const names = await readdir(this.root).catch(() => [] as string[]);
    const swept = (
      await pLimit(SWEEP_CONCURRENCY).map(names, async (name) => {
        const dir = join(this.root, name);
        // A held dir is never deleted (it may be another user's, kept for a human).
        const leftover =
          name.startsWith(".trash-") ||
          (!name.startsWith(".") &&
            !keep.has(name) &&
            !this.holds.has(dir) &&
            (await holdsOnlyEmptyRunnerDir(dir)));
        if (!leftover) return undefined;
        // Stryker disable next-line BooleanLiteral: force only matters for a missing dir, and its error is ignored anyway.
        await rm(dir, { recursive: true, force: true }).catch(() => undefined);
        return dir;
      })
    ).filter((dir) => dir !== undefined);
    // Stryker disable next-line ConditionalExpression,EqualityOperator: an fsync with nothing swept is only a wasted call.
    if (swept.length > 0) await syncDirectory(this.root).catch(() => undefined);
    return swept;
  }

  /**
   * Moves an unusable task.json to `<home>/quarantine/` with a note of `reason`, so it is kept
   * for a human, never read again, and not deleted by a later remove of its task.
   */
  async quarantine(dir: string, reason: string): Promise<string> {
    return quarantineStateFile(dirname(this.root), dir, TASK_STATE_FILE, reason, VERSION);
  }

  /**
   * Moves a whole task dir the shim does not enter (a symlink, moved as the link; a dir of
   * another user) to `<home>/quarantine/` with a note of `reason`.
   */
  async quarantineDir(dir: string, reason: string): Promise<string> {
    return quarantineTaskDir(dirname(this.root), dir, reason, VERSION);
  }

  /** Sweeps the quarantine by age and count; how many files it holds. */
  async sweepQuarantine(): Promise<number> {
    return sweepQuarantine(dirname(this.root));
  }

  /** Deletes the dir's stale temp files (by the scan's synchronous calls); the names left, or `undefined` if it cannot be listed. */
  private sweepTempFiles(dir: string): string[] | undefined {
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch {
      return undefined;
    }
    const prefix = tempFilePrefix(join(dir, TASK_STATE_FILE));
    for (const name of names) {
      if (!name.startsWith(prefix)) continue;
      try {
        unlinkSync(join(dir, name));
      } catch {
        // Left for the next start: a temp file is never read.
      }
    }
    return names.filter((name) => !name.startsWith(prefix));
  }
}

/** The target of a symlink, or `fallback` when it cannot be read. */
function readLinkOr(path: string, fallback: string): string {
  try {
    return readlinkSync(path);
  } catch {
    return fallback;
  }
}

/**
 * A scanned dir wider than 0700 narrowed to it. A home that cannot take the chmod (read-only,
 * immutable) does not stop the scan: `narrowError` says why.
 */
async function narrowed(found: ScannedTaskDir): Promise<ScannedTaskDir> {
  return chmod(found.dir, 0o700).then(
    () => found,
    (error: unknown) => ({ ...found, narrowError: describeFsError(error) }),
  );
}

/** How long the scan runs between two yields to the event loop, in ms. */
const SCAN_SLICE_MS = 5;

/** Task dirs a sweep of leftovers looks at at once. */
const SWEEP_CONCURRENCY = 16;

async function holdsOnlyEmptyRunnerDir(dir: string): Promise<boolean> {
  try {
    // A symlink is never followed into (the scan quarantines it).
    if (!(await lstat(dir)).isDirectory()) return false;
    const entries = await readdir(dir);
    if (entries.some((e) => e !== RUNNER_SUBDIR)) return false;
    return entries.length === 0 || (await readdir(join(dir, RUNNER_SUBDIR))).length === 0;
  } catch {
    return false;
  }
}
