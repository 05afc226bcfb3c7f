import { mkdir, readdir, rename, unlink } from "node:fs/promises";
import { basename, join } from "node:path";
import { syncDirectory, writeFileDurably } from "./durable-write.js";

/**
 * `<home>/quarantine/`: the task.json files no version of the format could read, each with a
 * note of why. They live outside the task dirs, so a later remove of the same task id (which
 * deletes its dir) never deletes the evidence; they are swept by age and count at each start.
 */
export const QUARANTINE_DIR = "quarantine";

/** How long, and how many, quarantined files are kept (the newest win). */
export const QUARANTINE_RETENTION = { maxAgeMs: 30 * 24 * 60 * 60 * 1000, maxFiles: 100 } as const;

const STATE_SUFFIX = ".task.json";
const NOTE_SUFFIX = ".note.json";
/** `<task dir name>.<epoch ms>.task.json` */
const ENTRY = /^(.+)\.(\d+)\.task\.json$/;

/** What the note beside a quarantined file says. */
export interface QuarantineNote {
  readonly task_dir: string;
  readonly reason: string;
  readonly quarantined_at: string;
  readonly by_version: string;
}

/**
 * Moves `<taskDir>/task.json` into the quarantine dir of `home` with a note beside it (the note
 * first: a file there never lacks its reason but for a crash between the two). Returns the
 * quarantined file's path.
 */
export async function quarantineStateFile(
  home: string,
  taskDir: string,
  stateFile: string,
  reason: string,
  version: string,
  now = Date.now(),
): Promise<string> {
  const root = join(home, QUARANTINE_DIR);
  await mkdir(root, { recursive: true, mode: 0o700 });
  const stem = `${basename(taskDir)}.${now}`;
  const note: QuarantineNote = {
    task_dir: taskDir,
    reason,
    quarantined_at: new Date(now).toISOString(),
    by_version: version,
  };
  await writeFileDurably(join(root, `${stem}${NOTE_SUFFIX}`), `${JSON.stringify(note)}\n`);
  const target = join(root, `${stem}${STATE_SUFFIX}`);
  await rename(join(taskDir, stateFile), target);
  await syncDirectory(taskDir);
  await syncDirectory(root);
  return target;
}

/**
 * Deletes quarantined files (and their notes) older than the retention age or beyond the
 * newest `maxFiles`, and notes left without their file. Returns how many files it holds.
 */
export async function sweepQuarantine(
  home: string,
  now = Date.now(),
  retention: { readonly maxAgeMs: number; readonly maxFiles: number } = QUARANTINE_RETENTION,
): Promise<number> {
  const root = join(home, QUARANTINE_DIR);
  const names = await readdir(root).catch(() => [] as string[]);
  const entries = names
    .map((name) => ENTRY.exec(name))
    .filter((m) => m !== null)
    .map((m) => ({ stem: `${m[1]}.${m[2]}`, at: Number(m[2]) }))
    .sort((a, b) => b.at - a.at);
  const kept = entries.filter((e, i) => i < retention.maxFiles && now - e.at <= retention.maxAgeMs);
  const keptStems = new Set(kept.map((e) => e.stem));
  const doomed = names.filter((name) => {
    const stem = name.endsWith(STATE_SUFFIX)
      ? name.slice(0, -STATE_SUFFIX.length)
      : name.endsWith(NOTE_SUFFIX)
        ? name.slice(0, -NOTE_SUFFIX.length)
        : undefined;
    return stem !== undefined && !keptStems.has(stem);
  });
  for (const name of doomed) await unlink(join(root, name)).catch(() => undefined);
  if (doomed.length > 0) await syncDirectory(root).catch(() => undefined);
  return kept.length;
}
