import { lstat, mkdir, readdir, rename, rm, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileKindOf, readBoundedFile } from "./bounded-read.js";
import { syncDirectory, writeFileDurably } from "./durable-write.js";
import { describeFsError } from "./log-file-sink.js";

/**
 * `<home>/quarantine/`: the task.json files no version of the format could read, and the task
 * dirs the shim will not enter (a symlink, a dir of another user), each with a note of why. They
 * live outside the task dirs, so a later remove of the same task id (which deletes its dir)
 * never deletes the evidence; they are swept by age and count at each start.
 */
export const QUARANTINE_DIR = "quarantine";

/**
 * How long, and how many, quarantined files are kept (the newest win). Age is counted twice: by
 * the wall clock and by the starts that swept since a file was first seen; a file goes only when
 * both say it is old, so a clock stepped years ahead (a bad RTC, a wrong NTP answer) deletes no
 * evidence by itself.
 */
export const QUARANTINE_RETENTION = {
  maxAgeMs: 30 * 24 * 60 * 60 * 1000,
  maxFiles: 100,
  minSweeps: 3,
} as const;

/** The quarantine's own count of sweeps, and the sweep each entry was first seen at. */
const SWEEPS_FILE = ".sweeps.json";
const MAX_SWEEPS_FILE_BYTES = 64 * 1024;

const STATE_SUFFIX = ".task.json";
const DIR_SUFFIX = ".taskdir";
const NOTE_SUFFIX = ".note.json";
/** `<task dir name>.<epoch ms>.task.json`, or `….taskdir` for a whole task dir. */
const ENTRY = /^(.+)\.(\d+)\.(?:task\.json|taskdir)$/;

/** What the note beside a quarantined file says. */
export interface QuarantineNote {
  readonly task_dir: string;
  readonly reason: string;
  readonly quarantined_at: string;
  readonly by_version: string;
}

/**
 * Something could not be set aside: the quarantine dir cannot be made or is not a directory
 * (a file, a symlink), the note cannot be written (a full disk), or the move failed. Nothing was
 * moved: the caller leaves what it meant to move where it is, and never writes over it.
 */
export class QuarantineError extends Error {
  override readonly name = "QuarantineError";
}

/**
 * Moves `<taskDir>/task.json` into the quarantine dir of `home` with a note beside it (the note
 * first: a file there never lacks its reason but for a crash between the two). Returns the
 * quarantined file's path; throws {@link QuarantineError} with the file left in place.
 */
export async function quarantineStateFile(
  home: string,
  taskDir: string,
  stateFile: string,
  reason: string,
  version: string,
  now = Date.now(),
): Promise<string> {
  return setAside(home, taskDir, join(taskDir, stateFile), STATE_SUFFIX, reason, version, now);
}

/**
 * Moves a whole task dir (a symlink, moved as the link and never followed, or a dir the shim
 * does not own) into the quarantine dir of `home` as `<name>.<ms>.taskdir`, with a note. Throws
 * {@link QuarantineError} with the dir left in place.
 */
export async function quarantineTaskDir(
  home: string,
  taskDir: string,
  reason: string,
  version: string,
  now = Date.now(),
): Promise<string> {
  return setAside(home, taskDir, taskDir, DIR_SUFFIX, reason, version, now);
}

async function setAside(
  home: string,
  taskDir: string,
  source: string,
  suffix: string,
  reason: string,
  version: string,
  now: number,
): Promise<string> {
  const root = join(home, QUARANTINE_DIR);
  const failed = (what: string, cause: unknown): QuarantineError =>
    new QuarantineError(`cannot move ${source} to ${root}: ${what}: ${describeFsError(cause)}`, { cause });
  await quarantineRoot(root).catch((cause: unknown) => {
    throw cause instanceof QuarantineError ? cause : failed("cannot make the quarantine dir", cause);
  });
  const stem = `${basename(taskDir)}.${now}`;
  const note: QuarantineNote = {
    task_dir: taskDir,
    reason,
    quarantined_at: new Date(now).toISOString(),
    by_version: version,
  };
  const notePath = join(root, `${stem}${NOTE_SUFFIX}`);
  await writeFileDurably(notePath, `${JSON.stringify(note)}\n`).catch((cause: unknown) => {
    throw failed("cannot write its note", cause);
  });
  const target = join(root, `${stem}${suffix}`);
  try {
    await rename(source, target);
  } catch (cause) {
    // A note without its file is swept at the next start; deleted now, it never misleads.
    await unlink(notePath).catch(() => undefined);
    throw failed("cannot move it", cause);
  }
  await syncDirectory(dirname(source));
  await syncDirectory(root);
  return target;
}

/**
 * The quarantine dir, made (0700) when absent. One that is not a directory of its own (a file, a
 * symlink that would send the evidence elsewhere) is refused, never replaced.
 */
async function quarantineRoot(root: string): Promise<void> {
  let seen;
  try {
    seen = await lstat(root);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    await mkdir(root, { recursive: true, mode: 0o700 });
    return;
  }
  if (!seen.isDirectory()) {
    const kind = seen.isFile() ? "a regular file" : fileKindOf(seen);
    throw new QuarantineError(`the quarantine ${root} is ${kind}, not a directory`);
  }
}

/**
 * Deletes quarantined files (and their notes) older than the retention age, by the wall clock and
 * by starts, or beyond the newest `maxFiles`, and notes left without their file. Returns how many
 * files it holds.
 */
export async function sweepQuarantine(
  home: string,
  now = Date.now(),
  retention: {
    readonly maxAgeMs: number;
    readonly maxFiles: number;
    readonly minSweeps: number;
  } = QUARANTINE_RETENTION,
): Promise<number> {
  const root = join(home, QUARANTINE_DIR);
  // A quarantine that is not a directory of its own (a symlink) is never swept through.
  const seen = await lstat(root).catch(() => undefined);
  if (seen === undefined || !seen.isDirectory()) return 0;
  const names = await readdir(root).catch(() => [] as string[]);
  const sweeps = await readSweeps(root);
  const sweep = sweeps.count + 1;
  const entries = names
    .map((name) => ENTRY.exec(name))
    .filter((m) => m !== null)
    .map((m) => {
      const stem = `${m[1]}.${m[2]}`;
      return { stem, at: Number(m[2]), firstSeen: sweeps.firstSeen[stem] ?? sweep };
    })
    // Newest first: by the sweep that first saw it (a count no clock can step), then by its time.
    .sort((a, b) => b.firstSeen - a.firstSeen || b.at - a.at);
  const old = (e: (typeof entries)[number]): boolean =>
    now - e.at > retention.maxAgeMs && sweep - e.firstSeen >= retention.minSweeps;
  const kept = entries.filter((e, i) => i < retention.maxFiles && !old(e));
  const keptStems = new Set(kept.map((e) => e.stem));
  const doomed = names.filter((name) => {
    const suffix = [STATE_SUFFIX, DIR_SUFFIX, NOTE_SUFFIX].find((s) => name.endsWith(s));
    const stem = suffix === undefined ? undefined : name.slice(0, -suffix.length);
    return stem !== undefined && !keptStems.has(stem);
  });
  // A quarantined task dir goes whole; a symlink is removed as the link, never followed.
  // Stryker disable next-line BooleanLiteral: force only matters for an entry already gone.
  for (const name of doomed)
    await rm(join(root, name), { recursive: true, force: true }).catch(() => undefined);
  // A count that cannot be written is counted again from here next time: files look newer, never older.
  await writeFileDurably(
    join(root, SWEEPS_FILE),
    `${JSON.stringify({ count: sweep, first_seen: Object.fromEntries(kept.map((e) => [e.stem, e.firstSeen])) })}\n`,
  ).catch(() => undefined);
  if (doomed.length > 0) await syncDirectory(root).catch(() => undefined);
  return kept.length;
}

/** The sweep count and first sightings; a missing, unreadable or damaged file counts from 0. */
async function readSweeps(root: string): Promise<{ count: number; firstSeen: Record<string, number> }> {
  const none = { count: 0, firstSeen: {} };
  try {
    const parsed = JSON.parse(await readBoundedFile(join(root, SWEEPS_FILE), MAX_SWEEPS_FILE_BYTES)) as {
      count?: unknown;
      first_seen?: unknown;
    };
    if (typeof parsed.count !== "number" || !Number.isSafeInteger(parsed.count) || parsed.count < 0)
      return none;
    const firstSeen: Record<string, number> = {};
    if (typeof parsed.first_seen === "object" && parsed.first_seen !== null) {
      for (const [stem, at] of Object.entries(parsed.first_seen)) {
        if (typeof at === "number" && Number.isSafeInteger(at) && at <= parsed.count) firstSeen[stem] = at;
      }
    }
    return { count: parsed.count, firstSeen };
  } catch {
    return none;
  }
}
