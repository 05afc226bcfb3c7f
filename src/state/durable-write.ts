import { link, open, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

let counter = 0;

/** The prefix of temp files written next to their target; swept at startup. */
export function tempFilePrefix(target: string): string {
  return `.${basename(target)}.tmp-`;
}

/**
 * Writes `data` to a new temp file beside `target` and fsyncs it; returns its path. A failure
 * removes it.
 */
async function writeSyncedTemp(target: string, data: string | Uint8Array, mode: number): Promise<string> {
  // Stryker disable next-line UpdateOperator: any change per call keeps the names unique.
  const temp = join(dirname(target), `${tempFilePrefix(target)}${process.pid}-${++counter}`);
  const file = await open(temp, "wx", mode);
  try {
    try {
      await file.writeFile(data);
      await file.sync();
    } finally {
      await file.close();
    }
  } catch (error) {
    await unlink(temp).catch(() => undefined);
    throw error;
  }
  return temp;
}

/**
 * Replaces `target` with `data` so that after a crash at any instant the file is either the
 * old or the new content, and the new name survives a power loss: temp file, fsync, rename,
 * fsync the directory.
 *
 * Hand-written because write-file-atomic never fsyncs the parent directory.
 */
export async function writeFileDurably(
  target: string,
  data: string | Uint8Array,
  mode = 0o600,
): Promise<void> {
  const temp = await writeSyncedTemp(target, data, mode);
  try {
    await rename(temp, target);
  } catch (error) {
    await unlink(temp).catch(() => undefined);
    throw error;
  }
  await syncDirectory(dirname(target));
}

/** fsyncs a directory so that entries created, renamed or removed in it are durable. */
export async function syncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Creates `target` with `data` only if it does not exist, durably: temp file, fsync, a hard link
 * to the target (which fails if anything is there, a dangling symlink included: never followed
 * nor replaced), fsync the directory. A crash leaves the complete file or none, never a partial
 * one. Returns `"exists"` and writes nothing when the target was already there.
 */
export async function createFileDurably(
  target: string,
  data: string | Uint8Array,
  mode = 0o600,
): Promise<"created" | "exists"> {
  const temp = await writeSyncedTemp(target, data, mode);
  try {
    await link(temp, target);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return "exists";
    throw error;
  } finally {
    await unlink(temp).catch(() => undefined);
  }
  await syncDirectory(dirname(target));
  return "created";
}
