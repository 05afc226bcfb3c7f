import { constants, type Stats } from "node:fs";
import { lstat, open } from "node:fs/promises";

/*
 * Reading a small file the shim keeps in its home without trusting what is at the path: a home
 * can hold anything a user (or a bug) put there. A symlink is never followed (it could name
 * /dev/zero or another user's file), a FIFO or a device is never opened for a blocking read (it
 * would hold the start for ever, the home lock with it), and no more than a cap is read (a
 * 63 MB file used to be loaded whole).
 */

/** What a path holds when it is not a regular file, in the words of a log line. */
export type FileKind =
  | "a symbolic link"
  | "a FIFO"
  | "a character device"
  | "a block device"
  | "a directory"
  | "a socket"
  | "not a regular file";

/** The kind of what `stats` (from `lstat` or `fstat`) describes, when it is not a regular file. */
export function fileKindOf(
  stats: Pick<
    Stats,
    "isSymbolicLink" | "isFIFO" | "isCharacterDevice" | "isBlockDevice" | "isDirectory" | "isSocket"
  >,
): FileKind {
  if (stats.isSymbolicLink()) return "a symbolic link";
  if (stats.isFIFO()) return "a FIFO";
  if (stats.isCharacterDevice()) return "a character device";
  if (stats.isBlockDevice()) return "a block device";
  if (stats.isDirectory()) return "a directory";
  if (stats.isSocket()) return "a socket";
  return "not a regular file";
}

/** The path holds something other than a regular file; it was not opened for a read. */
export class NotRegularFileError extends Error {
  override readonly name = "NotRegularFileError";
  constructor(
    readonly path: string,
    readonly kind: FileKind,
    options?: ErrorOptions,
  ) {
    super(`${path} is ${kind === "not a regular file" ? kind : `${kind}, not a regular file`}`, options);
  }
}

/** The file is larger than the cap its reader allows; at most the cap (plus a byte) was read. */
export class FileTooLargeError extends Error {
  override readonly name = "FileTooLargeError";
  constructor(
    readonly path: string,
    readonly limitBytes: number,
    /** The size the file had when it was looked at; undefined when it grew during the read. */
    readonly sizeBytes: number | undefined,
  ) {
    super(
      `${path} is larger than ${describeBytes(limitBytes)}${sizeBytes !== undefined ? ` (${sizeBytes} bytes)` : ""}`,
    );
  }
}

/** `1 MiB`, `64 KiB`, or bytes. */
export function describeBytes(bytes: number): string {
  if (bytes % (1024 * 1024) === 0) return `${bytes / (1024 * 1024)} MiB`;
  if (bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}

/**
 * Reads a regular file of at most `maxBytes` as UTF-8 text. What is at the path is looked at
 * first (`lstat`: a symlink, FIFO or device is refused without being opened), then opened with
 * `O_NOFOLLOW|O_NONBLOCK|O_NOCTTY` and checked again on the handle (`fstat`), which decides: the
 * path may have been replaced in between. At most `maxBytes + 1` bytes are read, so a file that
 * grew since is caught too.
 *
 * Throws {@link NotRegularFileError}, {@link FileTooLargeError}, or the file system's own error
 * (`ENOENT` when there is nothing at the path, for the caller to tell apart).
 */
export async function readBoundedFile(path: string, maxBytes: number): Promise<string> {
  const seen = await lstat(path);
  if (!seen.isFile()) throw new NotRegularFileError(path, fileKindOf(seen));
  if (seen.size > maxBytes) throw new FileTooLargeError(path, maxBytes, seen.size);
  let handle;
  try {
    handle = await open(
      path,
      constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY,
    );
  } catch (error) {
    // Replaced by a symlink since the lstat.
    if ((error as NodeJS.ErrnoException).code === "ELOOP") {
      throw new NotRegularFileError(path, "a symbolic link", { cause: error });
    }
    throw error;
  }
  try {
    const opened = await handle.stat();
    if (!opened.isFile()) throw new NotRegularFileError(path, fileKindOf(opened));
    if (opened.size > maxBytes) throw new FileTooLargeError(path, maxBytes, opened.size);
    // Sized by the fstat (a restore reads many small files at once); grown to the cap, plus the
    // byte that tells a file beyond it, only for a file that grew since.
    let buffer = Buffer.allocUnsafe(opened.size + 1);
    let length = 0;
    for (;;) {
      if (length === buffer.length) {
        if (length > maxBytes) throw new FileTooLargeError(path, maxBytes, undefined);
        buffer = Buffer.concat([buffer, Buffer.allocUnsafe(maxBytes + 1 - length)]);
      }
      const asked = buffer.length - length;
      const { bytesRead } = await handle.read(buffer, length, asked, length);
      length += bytesRead;
      // A short read of a regular file is its end: once the size fstat gave is in, the read of 0
      // bytes that would confirm it is spared (a restore reads 200 of these at once).
      if (bytesRead === 0 || (bytesRead < asked && length >= opened.size)) break;
    }
    if (length > maxBytes) throw new FileTooLargeError(path, maxBytes, undefined);
    return buffer.toString("utf8", 0, length);
  } finally {
    await handle.close();
  }
}
