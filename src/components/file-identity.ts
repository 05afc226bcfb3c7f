import type { BigIntStats } from "node:fs";
import { stat } from "node:fs/promises";

/**
 * What tells one file apart from another at a path, and a file from itself once rewritten: the
 * inode (device and number), its size, and its modification and change times to the nanosecond.
 * A rename over the path gives another inode; a write in place moves mtime and ctime; `touch -d`
 * can set mtime back but not ctime. Decimal strings, as they are stored in JSON.
 */
export interface FileIdentity {
  readonly dev: string;
  readonly ino: string;
  readonly size: string;
  readonly mtimeNs: string;
  readonly ctimeNs: string;
}

/** The identity of a file from its `stat(…, { bigint: true })`. */
export function identityOf(stats: BigIntStats): FileIdentity {
  return {
    dev: stats.dev.toString(),
    ino: stats.ino.toString(),
    size: stats.size.toString(),
    mtimeNs: stats.mtimeNs.toString(),
    ctimeNs: stats.ctimeNs.toString(),
  };
}

/** The identity of the file at `path` (symlinks followed, as `exec` does); undefined when it cannot be had. */
export async function fileIdentity(path: string): Promise<FileIdentity | undefined> {
  try {
    return identityOf(await stat(path, { bigint: true }));
  } catch {
    return undefined;
  }
}

/** Whether two identities are known and the same file, unchanged. */
export function sameFile(a: FileIdentity | undefined, b: FileIdentity | undefined): boolean {
  return (
    a !== undefined &&
    b !== undefined &&
    a.dev === b.dev &&
    a.ino === b.ino &&
    a.size === b.size &&
    a.mtimeNs === b.mtimeNs &&
    a.ctimeNs === b.ctimeNs
  );
}
