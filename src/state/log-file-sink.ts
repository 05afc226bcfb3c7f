import * as realFs from "node:fs";
import { errorMessage } from "../errors/error-message.js";
import { fileKindOf, NotRegularFileError } from "./bounded-read.js";

/** The synchronous file calls the sink makes; a port so tests can make them fail. */
export type LogFileOps = Pick<
  typeof realFs,
  "openSync" | "writeSync" | "closeSync" | "fstatSync" | "statSync"
>;

/** Options of {@link LogFileSink}; the defaults are the shim's. */
export interface LogFileSinkOptions {
  /** Unwritten bytes kept for a later write; beyond this, lines are dropped (default 1 MiB). */
  readonly maxPendingBytes?: number;
  /**
   * How often a failing file is retried (reopened), and how often a healthy one is checked for
   * having been deleted or replaced (default 1 s).
   */
  readonly retryMs?: number;
  /** The least time between two notices on stderr (default 60 s). */
  readonly noticeIntervalMs?: number;
  readonly fs?: LogFileOps;
  /** The monotonic clock (ms) of the retry and notice rate limits; tests pass their own. */
  readonly now?: () => number;
  /** Where notices go (default: stderr, written synchronously, errors ignored). */
  readonly notice?: (line: string) => void;
}

/** What the sink is doing, for metrics and tests. */
export interface LogFileSinkState {
  readonly writable: boolean;
  readonly pendingBytes: number;
  readonly droppedLines: number;
  /** `CODE: text` of the last failure while not writable. */
  readonly error?: string;
}

const MIB = 1024 * 1024;

/**
 * How the log file is opened: for appending, created 0600, never through a symlink (which could
 * send the shim's lines into any file it can write) and never by a blocking open (a FIFO without
 * a reader would hold the start for ever, the home lock with it).
 */
const OPEN_FLAGS =
  realFs.constants.O_WRONLY |
  realFs.constants.O_APPEND |
  realFs.constants.O_CREAT |
  realFs.constants.O_NOFOLLOW |
  realFs.constants.O_NONBLOCK |
  realFs.constants.O_NOCTTY;

/**
 * Opens the log file at `path` for appending (see {@link OPEN_FLAGS}); what it opened must be a
 * regular file, or it is closed again and the open fails (`NotRegularFileError`): a FIFO with a
 * reader, a device, or a socket is not where the log goes.
 */
function openLogFile(fs: LogFileOps, path: string): { fd: number; dev: number; ino: number } {
  let fd: number;
  try {
    fd = fs.openSync(path, OPEN_FLAGS, 0o600);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // ELOOP: a symlink (O_NOFOLLOW); ENXIO: a FIFO without a reader, or a socket.
    if (code === "ELOOP") throw new NotRegularFileError(path, "a symbolic link", { cause: error });
    if (code === "ENXIO") throw new NotRegularFileError(path, "not a regular file", { cause: error });
    throw error;
  }
  try {
    const stats = fs.fstatSync(fd);
    if (!stats.isFile()) throw new NotRegularFileError(path, fileKindOf(stats));
    return { fd, dev: stats.dev, ino: stats.ino };
  } catch (error) {
    try {
      fs.closeSync(fd);
    } catch {
      // the refusal matters, not the close
    }
    throw error;
  }
}

/**
 * Narrows an existing log file to 0600 (one made by an earlier version was 0644), through a
 * handle opened without following a symlink and only when it is a regular file: a chmod of the
 * path would have followed a symlink to any file. Never throws.
 */
export function narrowLogFileMode(path: string): void {
  let fd: number | undefined;
  try {
    fd = realFs.openSync(
      path,
      realFs.constants.O_RDONLY |
        realFs.constants.O_NOFOLLOW |
        realFs.constants.O_NONBLOCK |
        realFs.constants.O_NOCTTY,
    );
    const stats = realFs.fstatSync(fd);
    if (stats.isFile() && (stats.mode & 0o077) !== 0) realFs.fchmodSync(fd, 0o600);
  } catch {
    // absent, a symlink, or not ours: the sink reports what matters when it opens the file
  } finally {
    if (fd !== undefined) realFs.close(fd, () => undefined);
  }
}

function writeStderr(line: string): void {
  try {
    realFs.writeSync(2, `${line}\n`);
  } catch {
    // stderr itself is gone: nothing left to tell.
  }
}

/** `ENOSPC: no space left on device` from a Node file-system error (without the syscall and path). */
export function describeFsError(error: unknown): string {
  const message = errorMessage(error);
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  const match = /^([A-Z][A-Z0-9]+): ([^,]*)/.exec(message);
  if (match) return `${match[1]}: ${match[2]}`;
  return code ? `${code}: ${message}` : message;
}

const countLines = (chunk: string): number => {
  let n = 0;
  for (let i = chunk.indexOf("\n"); i !== -1; i = chunk.indexOf("\n", i + 1)) n++;
  return Math.max(n, 1);
};

/**
 * The `shim.log` destination of the logger. A write that fails (ENOSPC, EROFS, EIO, EPERM, the
 * file deleted or replaced) never throws into the caller and never ends the process: the line
 * waits in a bounded buffer (at most `maxPendingBytes`), lines beyond it are dropped and
 * counted, the failure is told on stderr at most once a minute, and the file is reopened every
 * `retryMs` until writes succeed again. It replaces pino's SonicBoom destination, whose failed
 * write is an `error` event that kills the process (or silences every stream after it).
 *
 * Writes are synchronous (as the SonicBoom destination was configured): a line is on its way to
 * the file system when the log call returns.
 */
export class LogFileSink {
  private fd: number | undefined;
  /** The file's identity when opened: a different one at the path means it was replaced. */
  private identity: { dev: number; ino: number } | undefined;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private dropped = 0;
  private failure: { error: string; since: number } | undefined;
  /** A write stopped inside a line: the next successful write starts on a new line. */
  private midLine = false;
  private lastAttemptAt = Number.NEGATIVE_INFINITY;
  private lastNoticeAt = Number.NEGATIVE_INFINITY;
  private retryTimer: NodeJS.Timeout | undefined;
  /** close() was called: no descriptor is kept open and no retry timer runs any more. */
  private closed = false;
  private readonly fs: LogFileOps;
  private readonly now: () => number;
  private readonly maxPendingBytes: number;
  private readonly retryMs: number;
  private readonly noticeIntervalMs: number;
  private readonly notice: (line: string) => void;
  /** Called with the number of lines each time some are dropped (a metrics counter). */
  onDropped: ((lines: number) => void) | undefined;

  constructor(
    readonly path: string,
    options: LogFileSinkOptions = {},
  ) {
    this.fs = options.fs ?? realFs;
    this.now = options.now ?? (() => performance.now());
    this.maxPendingBytes = options.maxPendingBytes ?? MIB;
    this.retryMs = options.retryMs ?? 1_000;
    this.noticeIntervalMs = options.noticeIntervalMs ?? 60_000;
    this.notice = options.notice ?? writeStderr;
  }

  /** The sink's state (writable, buffered bytes, lines dropped so far). */
  state(): LogFileSinkState {
    return {
      writable: this.failure === undefined,
      pendingBytes: this.pendingBytes,
      droppedLines: this.dropped,
      ...(this.failure ? { error: this.failure.error } : {}),
    };
  }

  /** Takes one or more complete lines. Never throws. */
  write(chunk: string): boolean {
    try {
      const data = Buffer.from(chunk, "utf8");
      if (this.closed) this.appendOnce(data, chunk);
      else this.writeLines(data, chunk);
    } catch (error) {
      // Nothing above should throw; if it does, the line is lost, never the process. The failure
      // first, so that the notice of the drop names it.
      this.fail(error);
      this.drop(countLines(chunk));
    }
    return true;
  }

  /** Writes are synchronous: nothing to flush. (pino calls this on `logger.flush()`.) */
  flushSync(): void {
    if (this.failure && !this.closed) this.retry(true);
  }

  /**
   * Makes one last attempt to write what is buffered (what still cannot be written is dropped
   * and counted), stops retrying and closes the file. Logging does not end there: a line that
   * comes later (work still settling while the shim stops, such as a task being finalized) is
   * appended with its own open, write and close, so it is not lost and no descriptor or timer
   * outlives close(). Such a line that cannot be written is dropped and counted, not kept.
   */
  close(): void {
    this.closed = true;
    this.stopRetrying();
    if (this.pending.length > 0) this.retry(true);
    this.dropPending();
    this.closeFd();
  }

  /** After close(): appends `data` through a descriptor of its own, closed before returning. */
  private appendOnce(data: Buffer, text: string): void {
    try {
      this.fd = openLogFile(this.fs, this.path).fd;
    } catch (error) {
      this.fail(error);
      this.drop(countLines(text));
      return;
    }
    try {
      const rest = this.writeAll(data);
      if (rest === undefined) this.failure = undefined;
      else if (rest.length > 0) this.drop(countLines(rest.toString("utf8")));
    } finally {
      this.closeFd();
    }
  }

  /** Drops (and counts) every buffered line: nothing will write them any more. */
  private dropPending(): void {
    if (this.pending.length === 0) return;
    const lines = this.pending.reduce((n, chunk) => n + countLines(chunk.toString("utf8")), 0);
    this.pending = [];
    this.pendingBytes = 0;
    this.drop(lines);
  }

  private writeLines(data: Buffer, text: string): void {
    const now = this.now();
    if (this.failure || this.fd === undefined) {
      this.retry(false);
    } else if (now - this.lastAttemptAt >= this.retryMs) {
      this.lastAttemptAt = now;
      if (this.replaced()) {
        this.closeFd();
        // Stryker disable next-line BooleanLiteral: on this path nothing failed, so retry() has no rate limit to skip.
        this.retry(true);
      }
    }
    if (this.fd !== undefined && this.pending.length === 0) {
      const rest = this.writeAll(data);
      // Stryker disable next-line ConditionalExpression,EqualityOperator: an empty rest, queued, is shifted off by the next retry without a write or a count.
      if (rest !== undefined && rest.length > 0) this.enqueue(rest, text);
      return;
    }
    this.enqueue(data, text);
  }

  /** Whether the path no longer names the open file (deleted, renamed away, replaced). */
  private replaced(): boolean {
    // Stryker disable next-line ConditionalExpression,BooleanLiteral: only called with a file opened by retry(), which sets both.
    if (this.fd === undefined || this.identity === undefined) return false;
    try {
      const { dev, ino } = this.fs.statSync(this.path);
      return dev !== this.identity.dev || ino !== this.identity.ino;
    } catch {
      return true;
    }
  }

  /**
   * Writes all of `data`; on a failure returns what was not written (the sink is then failing).
   * A partial write (a full disk accepts part of a line) leaves the rest for later.
   */
  private writeAll(data: Buffer): Buffer | undefined {
    let offset = 0;
    try {
      if (this.midLine) {
        this.fs.writeSync(this.fd as number, "\n");
        this.midLine = false;
      }
      while (offset < data.length) {
        offset += this.fs.writeSync(this.fd as number, data, offset, data.length - offset);
      }
      return undefined;
    } catch (error) {
      this.fail(error);
      if (offset === 0) return data;
      // A line cut by a full disk cannot be completed in place: it is ended with a newline on
      // the next write and the rest of it is dropped, so every other line stays whole.
      this.midLine = true;
      const end = data.indexOf(0x0a, offset);
      // Stryker disable next-line ConditionalExpression,LogicalOperator,EqualityOperator,UnaryOperator: pino writes whole lines, so a cut line always has its newline after the cut (end is never -1, and always below the length).
      if (end !== -1 && end < data.length) this.drop(1);
      // Stryker disable next-line ConditionalExpression,UnaryOperator: as above, end is never -1.
      return data.subarray(end === -1 ? data.length : end + 1);
    }
  }

  private enqueue(data: Buffer, text: string): void {
    if (this.pendingBytes + data.length > this.maxPendingBytes) {
      this.drop(countLines(text));
      return;
    }
    this.pending.push(data);
    this.pendingBytes += data.length;
  }

  private drop(lines: number): void {
    this.dropped += lines;
    this.onDropped?.(lines);
    this.announce();
  }

  /** Reopens the file and writes what is pending; rate-limited to one attempt per `retryMs`. */
  private retry(force: boolean): void {
    const now = this.now();
    if (!force && this.failure && now - this.lastAttemptAt < this.retryMs) return;
    this.lastAttemptAt = now;
    // Stryker disable next-line ConditionalExpression: a failure closes the file, so every caller comes here without one open.
    if (this.fd === undefined) {
      try {
        const { fd, dev, ino } = openLogFile(this.fs, this.path);
        this.fd = fd;
        this.identity = { dev, ino };
      } catch (error) {
        this.fd = undefined;
        this.fail(error);
        return;
      }
    }
    while (this.pending.length > 0) {
      const head = this.pending[0] as Buffer;
      const rest = this.writeAll(head);
      if (rest !== undefined) {
        this.pendingBytes -= head.length - rest.length;
        // Stryker disable next-line ConditionalExpression,EqualityOperator: an empty rest left at the head is shifted off by the next retry without a write or a count.
        if (rest.length > 0) this.pending[0] = rest;
        else this.pending.shift();
        return;
      }
      this.pending.shift();
      this.pendingBytes -= head.length;
    }
    if (this.failure) {
      const { since } = this.failure;
      this.failure = undefined;
      this.stopRetrying();
      // Under the same once-a-minute limit: a disk that flaps never floods stderr.
      if (now - this.lastNoticeAt >= this.noticeIntervalMs) {
        this.lastNoticeAt = now;
        this.notice(
          `taskshim: ${this.path} is writable again after ${Math.round((now - since) / 1000)} s; ${this.dropped} log lines dropped so far`,
        );
      }
    }
  }

  private fail(error: unknown): void {
    // Reopened on the next attempt: the file may have been replaced, or the mount remounted.
    this.closeFd();
    const first = this.failure === undefined;
    this.failure = { error: describeFsError(error), since: this.failure?.since ?? this.now() };
    if (first) this.announce();
    this.startRetrying();
  }

  /** At most one line per `noticeIntervalMs` on stderr. */
  private announce(): void {
    const now = this.now();
    if (now - this.lastNoticeAt < this.noticeIntervalMs) return;
    this.lastNoticeAt = now;
    // Stryker disable next-line StringLiteral: every drop follows a failure, so there is always one to name.
    const why = this.failure?.error ?? "unknown error";
    this.notice(
      `taskshim: cannot write ${this.path} (${why}); up to ${Math.round(this.maxPendingBytes / 1024)} KiB of log lines are kept for it, ${this.dropped} dropped so far; stdout logging continues`,
    );
  }

  private startRetrying(): void {
    if (this.retryTimer || this.closed) return;
    // Buffered lines reach the file once it is writable again, even if nothing more is logged.
    this.retryTimer = setInterval(() => {
      try {
        // The timer is the rate limit: a write in between must not push its attempt back.
        this.retry(true);
      } catch {
        // never let a timer throw
      }
    }, this.retryMs);
    this.retryTimer.unref();
  }

  private stopRetrying(): void {
    // Stryker disable next-line ConditionalExpression: clearInterval(undefined) does nothing.
    if (this.retryTimer) clearInterval(this.retryTimer);
    this.retryTimer = undefined;
  }

  private closeFd(): void {
    if (this.fd === undefined) return;
    try {
      this.fs.closeSync(this.fd);
    } catch {
      // a close that fails (EIO) still frees the descriptor
    }
    this.fd = undefined;
    this.identity = undefined;
  }
}
