import { closeSync, constants, fstatSync, lstatSync, openSync, readSync, type Stats } from "node:fs";
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

/** How a bounded read opens the path: never through a symlink, never waiting on a FIFO or a tty. */
const OPEN_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY;

/** Throws unless `stats` (an `lstat` of the path, or an `fstat` of its handle) is a regular file within the cap. */
function checkRegular(path: string, stats: Stats, maxBytes: number): void {
  if (!stats.isFile()) throw new NotRegularFileError(path, fileKindOf(stats));
  if (stats.size > maxBytes) throw new FileTooLargeError(path, maxBytes, stats.size);
}

/** The open's error, as a bounded read reports it: a symlink put there since the `lstat` is one. */
function openError(path: string, error: unknown): unknown {
  return (error as NodeJS.ErrnoException).code === "ELOOP"
    ? new NotRegularFileError(path, "a symbolic link", { cause: error })
    : error;
}

/**
 * The buffer of one bounded read: sized by the `fstat` (a restore reads many small files), grown
 * to the cap, plus the byte that tells a file beyond it, only for a file that grew since.
 */
class BoundedBuffer {
  private buffer: Buffer;
  private length = 0;

  constructor(
    private readonly path: string,
    private readonly maxBytes: number,
    private readonly size: number,
  ) {
    this.buffer = Buffer.allocUnsafe(size + 1);
  }

  /** Where the next read goes: `buffer` from `offset` (also the file position), `length` bytes. */
  next(): { buffer: Buffer; offset: number; length: number } {
    if (this.length === this.buffer.length) {
      if (this.length > this.maxBytes) throw new FileTooLargeError(this.path, this.maxBytes, undefined);
      this.buffer = Buffer.concat([this.buffer, Buffer.allocUnsafe(this.maxBytes + 1 - this.length)]);
    }
    return { buffer: this.buffer, offset: this.length, length: this.buffer.length - this.length };
  }

  /**
   * Takes a read's count; whether the file is read to its end. A short read of a regular file is
   * its end: once the size fstat gave is in, the read of 0 bytes that would confirm it is spared.
   */
  took(bytesRead: number, asked: number): boolean {
    this.length += bytesRead;
    return bytesRead === 0 || (bytesRead < asked && this.length >= this.size);
  }

  text(): string {
    if (this.length > this.maxBytes) throw new FileTooLargeError(this.path, this.maxBytes, undefined);
    return this.buffer.toString("utf8", 0, this.length);
  }
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
  checkRegular(path, await lstat(path), maxBytes);
  const handle = await open(path, OPEN_FLAGS).catch((error: unknown) => {
    throw openError(path, error);
  });
  try {
    const opened = await handle.stat();
    checkRegular(path, opened, maxBytes);
    const into = new BoundedBuffer(path, maxBytes, opened.size);
    for (;;) {
      const { buffer, offset, length } = into.next();
      const { bytesRead } = await handle.read(buffer, offset, length, offset);
      if (into.took(bytesRead, length)) return into.text();
    }
  } finally {
    await handle.close();
  }
}

/**
 * {@link readBoundedFile} by synchronous calls, for the restore's scan of the task dirs: on a
 * warm page cache each of its five calls costs a few microseconds, where a round trip through
 * libuv's thread pool costs tens, and the scan (seven calls a dir) held a restart of 200 tasks
 * back by ~40 ms (BENCHMARKS.md, the restart's profile). Not for a path read while the shim
 * serves: a slow disk would stall the event loop.
 */
export function readBoundedFileSync(path: string, maxBytes: number): string {
  checkRegular(path, lstatSync(path), maxBytes);
  let fd: number;
  try {
    fd = openSync(path, OPEN_FLAGS);
  } catch (error) {
    throw openError(path, error);
  }
  try {
    const opened = fstatSync(fd);
    checkRegular(path, opened, maxBytes);
    const into = new BoundedBuffer(path, maxBytes, opened.size);
    for (;;) {
      const { buffer, offset, length } = into.next();
      if (into.took(readSync(fd, buffer, offset, length, offset), length)) return into.text();
    }
  } finally {
    closeSync(fd);
  }
}
