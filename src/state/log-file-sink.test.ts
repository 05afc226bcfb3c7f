import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import { mkdtemp, readFile, rename, rm, symlink, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { describeFsError, LogFileSink, narrowLogFileMode, type LogFileOps } from "./log-file-sink.js";

let dir: string;
let path: string;
let clock: number;
let fault: string | undefined;
/** Bytes a write may still take before the fake disk is full (undefined: unlimited). */
let room: number | undefined;
let notices: string[];

function errno(code: string): NodeJS.ErrnoException {
  const error = new Error(`${code}: simulated failure, write`) as NodeJS.ErrnoException;
  error.code = code;
  return error;
}

/** Real files in a temp dir; `fault` makes open and write fail, `room` makes the disk fill up. */
const ops: LogFileOps = {
  openSync: (...args: Parameters<typeof fs.openSync>) => {
    if (fault) throw errno(fault);
    return fs.openSync(...args);
  },
  writeSync: ((fd: number, data: string | Buffer, offset?: number, length?: number) => {
    if (fault) throw errno(fault);
    // As strict as the real call: a range past the buffer is a RangeError, not a short write.
    if (typeof data !== "string" && (offset ?? 0) + (length ?? 0) > data.length) {
      throw new RangeError("ERR_OUT_OF_RANGE: length past the buffer");
    }
    const buf = typeof data === "string" ? Buffer.from(data) : data.subarray(offset ?? 0);
    const len = Math.min(length ?? buf.length, buf.length);
    if (room !== undefined) {
      if (room === 0) throw errno("ENOSPC");
      const n = Math.min(room, len);
      room -= n;
      return fs.writeSync(fd, buf, 0, n);
    }
    return fs.writeSync(fd, buf, 0, len);
  }) as typeof fs.writeSync,
  closeSync: fs.closeSync,
  fstatSync: fs.fstatSync,
  statSync: fs.statSync,
};

function sink(options: { maxPendingBytes?: number } = {}): LogFileSink {
  return new LogFileSink(path, {
    fs: ops,
    now: () => clock,
    notice: (line) => notices.push(line),
    retryMs: 1_000,
    noticeIntervalMs: 60_000,
    ...options,
  });
}

const line = (n: number): string => `{"msg":"line ${n}"}\n`;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "log-sink-"));
  path = join(dir, "shim.log");
  clock = 1_000_000;
  fault = undefined;
  room = undefined;
  notices = [];
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("LogFileSink", () => {
  it("appends lines to the file", async () => {
    await writeFile(path, "before\n");
    const s = sink();
    s.write(line(1));
    s.write(line(2));
    expect(await readFile(path, "utf8")).toBe(`before\n${line(1)}${line(2)}`);
    expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 0 });
    s.close();
  });

  it.each(["ENOSPC", "EROFS", "EIO", "EPERM"])(
    "never throws on %s, keeps the lines and writes them once the file is writable again",
    async (code) => {
      const s = sink();
      s.write(line(1));
      fault = code;
      expect(() => s.write(line(2))).not.toThrow();
      expect(s.state()).toMatchObject({ writable: false, error: `${code}: simulated failure` });
      expect(notices).toHaveLength(1);
      expect(notices[0]).toContain(`cannot write ${path} (${code}: simulated failure)`);
      fault = undefined;
      s.write(line(3)); // within retryMs of the failure: still buffered
      expect(await readFile(path, "utf8")).toBe(line(1));
      clock += 60_000;
      s.write(line(4));
      expect(await readFile(path, "utf8")).toBe(`${line(1)}${line(2)}${line(3)}${line(4)}`);
      expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 0 });
      expect(notices.at(-1)).toContain("writable again");
      s.close();
    },
  );

  it("bounds what it keeps: lines beyond maxPendingBytes are dropped and counted", () => {
    const s = sink({ maxPendingBytes: 100 });
    let counted = 0;
    s.onDropped = (n) => (counted += n);
    fault = "ENOSPC";
    for (let i = 0; i < 50; i++) s.write(line(i));
    const state = s.state();
    expect(state.pendingBytes).toBeLessThanOrEqual(100);
    expect(state.droppedLines).toBe(50 - Math.floor(100 / line(0).length));
    expect(counted).toBe(state.droppedLines);
    s.close();
  });

  it("keeps at most 1 MiB by default while 3,000 lines fail", () => {
    const s = new LogFileSink(path, { fs: ops, now: () => clock, notice: (l) => notices.push(l) });
    fault = "ENOSPC";
    const big = `${JSON.stringify({ msg: "x".repeat(1_000) })}\n`;
    for (let i = 0; i < 3_000; i++) s.write(big);
    expect(s.state().pendingBytes).toBeLessThanOrEqual(1024 * 1024);
    expect(s.state().droppedLines).toBeGreaterThan(3_000 - (1024 * 1024) / big.length - 1);
    s.close();
  });

  it("announces on stderr at most once a minute", () => {
    const s = sink({ maxPendingBytes: 0 });
    fault = "EIO";
    for (let i = 0; i < 100; i++) {
      s.write(line(i));
      clock += 1_000;
    }
    // 100 s of failures: the first notice and one a minute later.
    expect(notices).toHaveLength(2);
    expect(notices[1]).toMatch(/\d+ dropped so far/);
    s.close();
  });

  it("stays within one notice a minute when the file fails and recovers every 2 s", () => {
    const s = sink();
    for (let i = 0; i < 60; i++) {
      fault = i % 2 === 0 ? "EIO" : undefined;
      s.write(line(i));
      clock += 1_000;
    }
    expect(notices.length).toBeLessThanOrEqual(1 + Math.ceil(60_000 / 60_000));
    s.close();
  });

  it("finishes a line cut by a full disk before the next one", async () => {
    const s = sink();
    room = 5;
    s.write(line(1));
    expect(s.state().writable).toBe(false);
    room = undefined;
    clock += 1_000;
    s.write(line(2));
    const text = await readFile(path, "utf8");
    // The cut line is ended and the rest of it dropped: the next line starts on its own.
    expect(text).toBe(`${line(1).slice(0, 5)}\n${line(2)}`);
    expect(s.state().droppedLines).toBe(1);
    s.close();
  });

  it("reopens the file when it was deleted or replaced", async () => {
    const s = sink();
    s.write(line(1));
    await unlink(path);
    clock += 1_000;
    s.write(line(2));
    expect(await readFile(path, "utf8")).toBe(line(2));
    await rename(path, `${path}.1`);
    await writeFile(path, "");
    clock += 1_000;
    s.write(line(3));
    expect(await readFile(path, "utf8")).toBe(line(3));
    expect(await readFile(`${path}.1`, "utf8")).toBe(line(2));
    s.close();
  });

  it("flushes buffered lines from its retry timer without a new line", async () => {
    const s = new LogFileSink(path, { fs: ops, retryMs: 20, notice: (l) => notices.push(l) });
    fault = "EROFS";
    s.write(line(1));
    fault = undefined;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(await readFile(path, "utf8")).toBe(line(1));
    s.close();
  });
});

describe("describeFsError", () => {
  it("keeps the code and the text, not the syscall or the path", () => {
    const error = Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });
    expect(describeFsError(error)).toBe("ENOSPC: no space left on device");
    const open = Object.assign(new Error("EROFS: read-only file system, open '/x/y'"), { code: "EROFS" });
    expect(describeFsError(open)).toBe("EROFS: read-only file system");
    expect(describeFsError(Object.assign(new Error("boom"), { code: "EIO" }))).toBe("EIO: boom");
  });
});

describe("LogFileSink under pino", () => {
  it("a failing shim.log neither throws into the log call nor silences stdout", async () => {
    const { pino } = await import("pino");
    const { Writable } = await import("node:stream");
    const stdout: string[] = [];
    const out = new Writable({
      write(chunk: Buffer, _encoding, callback) {
        stdout.push(chunk.toString("utf8"));
        callback();
      },
    });
    const file = sink({ maxPendingBytes: 64 });
    const log = pino(
      { base: null, timestamp: false },
      pino.multistream([
        { level: "info", stream: out },
        { level: "info", stream: file },
      ]),
    );
    log.info("before");
    fault = "ENOSPC";
    for (let i = 0; i < 10; i++) expect(() => log.info({ i }, "while full")).not.toThrow();
    fault = undefined;
    clock += 1_000;
    log.info("after");
    await new Promise((resolve) => setImmediate(resolve));
    expect(stdout.join("").split("\n").filter(Boolean)).toHaveLength(12);
    const written = (await readFile(path, "utf8")).split("\n").filter(Boolean);
    expect(written[0]).toContain('"msg":"before"');
    expect(written.at(-1)).toContain('"msg":"after"');
    expect(file.state().droppedLines).toBe(12 - written.length);
    expect(file.state().droppedLines).toBeGreaterThan(0);
    file.close();
  });
});

describe("LogFileSink, in detail", () => {
  it("tells a failure and the recovery on stderr in exact words", () => {
    const s = sink({ maxPendingBytes: 2_048 });
    fault = "EIO";
    expect(s.write(line(1))).toBe(true);
    expect(notices).toEqual([
      `taskshim: cannot write ${path} (EIO: simulated failure); up to 2 KiB of log lines are kept for it, 0 dropped so far; stdout logging continues`,
    ]);
    fault = undefined;
    clock += 61_000;
    s.write(line(2));
    expect(notices[1]).toBe(`taskshim: ${path} is writable again after 61 s; 0 log lines dropped so far`);
    s.close();
  });

  it("counts every line of a dropped chunk, and a chunk without a newline as one", () => {
    const s = sink({ maxPendingBytes: 0 });
    fault = "ENOSPC";
    s.write(`${line(1)}${line(2)}${line(3)}`);
    expect(s.state().droppedLines).toBe(3);
    s.write("no newline");
    expect(s.state().droppedLines).toBe(4);
    s.close();
  });

  it("flushSync retries a failing file at once, within retryMs", async () => {
    const s = sink();
    fault = "EROFS";
    s.write(line(1));
    fault = undefined;
    s.flushSync();
    expect(await readFile(path, "utf8")).toBe(line(1));
    expect(s.state().writable).toBe(true);
    s.close();
  });

  it("looks for a replaced file at most once per retryMs", async () => {
    const s = sink();
    s.write(line(1));
    await unlink(path);
    // Within retryMs of the last look: the line goes to the open (deleted) file.
    s.write(line(2));
    expect(fs.existsSync(path)).toBe(false);
    clock += 1_000;
    s.write(line(3));
    expect(await readFile(path, "utf8")).toBe(line(3));
    s.close();
  });

  it("ends a cut line once, then writes whole lines again", async () => {
    const s = sink();
    room = 5;
    s.write(`${line(1)}${line(2)}`);
    expect(s.state().droppedLines).toBe(1);
    room = undefined;
    clock += 1_000;
    s.write(line(3));
    s.write(line(4));
    expect(await readFile(path, "utf8")).toBe(`${line(1).slice(0, 5)}\n${line(2)}${line(3)}${line(4)}`);
    s.close();
  });

  it("close stops the retry timer and closes the file", async () => {
    const closed: number[] = [];
    const s = new LogFileSink(path, {
      fs: { ...ops, closeSync: (fd: number) => (closed.push(fd), fs.closeSync(fd)) },
      retryMs: 20,
      notice: (l) => notices.push(l),
    });
    s.write(line(1));
    s.close();
    expect(closed).toHaveLength(1);
    const t = new LogFileSink(path, { fs: ops, retryMs: 20, notice: (l) => notices.push(l) });
    fault = "EROFS";
    t.write(line(2));
    t.close();
    fault = undefined;
    await new Promise((resolve) => setTimeout(resolve, 100));
    // No timer wrote the buffered line after close.
    expect(await readFile(path, "utf8")).toBe(line(1));
  });
});

describe("LogFileSink.close", () => {
  /** The ops of the test, counting the descriptors opened and closed. */
  function counting(): { ops: LogFileOps; opened: () => number; closed: () => number } {
    let opened = 0;
    let closed = 0;
    return {
      ops: {
        ...ops,
        openSync: (...args: Parameters<typeof fs.openSync>) => {
          const fd = ops.openSync(...args);
          opened++;
          return fd;
        },
        closeSync: (fd: number) => {
          closed++;
          fs.closeSync(fd);
        },
      },
      opened: () => opened,
      closed: () => closed,
    };
  }

  it("writes what is buffered once more before closing the file", async () => {
    const c = counting();
    const s = new LogFileSink(path, { fs: c.ops, now: () => clock, notice: (l) => notices.push(l) });
    fault = "EIO";
    s.write(line(1));
    fault = undefined;
    // Within retryMs: still buffered, until close tries once more.
    s.close();
    expect(await readFile(path, "utf8")).toBe(line(1));
    expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 0 });
    expect(c.opened()).toBe(c.closed());
  });

  it("drops and counts what it still cannot write, and no timer writes it later", async () => {
    const s = new LogFileSink(path, { fs: ops, retryMs: 20, notice: (l) => notices.push(l) });
    let counted = 0;
    s.onDropped = (n) => (counted += n);
    fault = "EROFS";
    s.write(`${line(1)}${line(2)}`);
    s.write(line(3));
    s.close();
    expect(s.state()).toMatchObject({ pendingBytes: 0, droppedLines: 3 });
    expect(counted).toBe(3);
    fault = undefined;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(fs.existsSync(path)).toBe(false);
  });

  it("a line after close is appended (not lost), and leaves no descriptor or timer open", async () => {
    const c = counting();
    const s = new LogFileSink(path, { fs: c.ops, now: () => clock, notice: (l) => notices.push(l) });
    s.write(line(1));
    s.close();
    expect(c.opened()).toBe(1);
    expect(c.closed()).toBe(1);
    s.write(line(2));
    s.write(line(3));
    expect(await readFile(path, "utf8")).toBe(`${line(1)}${line(2)}${line(3)}`);
    expect(c.opened()).toBe(3);
    expect(c.closed()).toBe(3);
    // flushSync after close opens nothing either.
    s.flushSync();
    expect(c.opened()).toBe(3);
    expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 0 });
  });

  it("a line after close that cannot be written is dropped and counted, not kept, and the next one is written", async () => {
    const c = counting();
    const s = new LogFileSink(path, {
      fs: c.ops,
      now: () => clock,
      retryMs: 20,
      notice: (l) => notices.push(l),
    });
    s.close();
    fault = "ENOSPC";
    s.write(`${line(1)}${line(2)}`);
    expect(s.state()).toEqual({
      writable: false,
      pendingBytes: 0,
      droppedLines: 2,
      error: "ENOSPC: simulated failure",
    });
    expect(notices).toEqual([expect.stringContaining(`cannot write ${path} (ENOSPC: simulated failure)`)]);
    fault = undefined;
    await new Promise((resolve) => setTimeout(resolve, 60));
    // No timer retried the dropped lines.
    expect(fs.existsSync(path)).toBe(false);
    s.write(line(3));
    expect(await readFile(path, "utf8")).toBe(line(3));
    expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 2 });
    expect(c.opened()).toBe(c.closed());
  });

  it("after close, a line cut by a full disk is ended on the next write and the rest of the chunk dropped", async () => {
    const s = sink();
    s.close();
    room = 5;
    s.write(`${line(1)}${line(2)}`);
    expect(s.state().droppedLines).toBe(2);
    room = undefined;
    s.write(line(3));
    expect(await readFile(path, "utf8")).toBe(`${line(1).slice(0, 5)}\n${line(3)}`);
  });
});

describe("LogFileSink: descriptors, timers and notices", () => {
  function counting(extra: Partial<LogFileOps> = {}): {
    ops: LogFileOps;
    opened: () => number;
    closed: () => number;
  } {
    let opened = 0;
    let closed = 0;
    const base = { ...ops, ...extra };
    return {
      ops: {
        ...base,
        openSync: (...args: Parameters<typeof fs.openSync>) => {
          const fd = base.openSync(...args);
          opened++;
          return fd;
        },
        closeSync: (fd: number) => {
          closed++;
          fs.closeSync(fd);
        },
      },
      opened: () => opened,
      closed: () => closed,
    };
  }
  const sinkOver = (
    o: LogFileOps,
    options: { retryMs?: number; maxPendingBytes?: number } = {},
  ): LogFileSink =>
    new LogFileSink(path, {
      fs: o,
      now: () => clock,
      notice: (l) => notices.push(l),
      retryMs: 1_000,
      ...options,
    });
  const refusingOpen = (code: string): Partial<LogFileOps> => ({
    openSync: () => {
      throw errno(code);
    },
  });

  it("keeps a healthy file open across checks: opened once, however long it runs", async () => {
    const c = counting();
    const s = sinkOver(c.ops);
    for (let i = 0; i < 5; i++) {
      s.write(line(i));
      clock += 1_000;
    }
    expect(c.opened()).toBe(1);
    expect(c.closed()).toBe(0);
    s.close();
    expect(await readFile(path, "utf8")).toBe([0, 1, 2, 3, 4].map(line).join(""));
  });

  it("flushSync on a healthy sink opens nothing", () => {
    const c = counting();
    const s = sinkOver(c.ops);
    s.flushSync();
    expect(c.opened()).toBe(0);
    expect(fs.existsSync(path)).toBe(false);
    s.close();
  });

  it("closes the file as soon as a write fails", () => {
    const c = counting();
    const s = sinkOver(c.ops);
    s.write(line(1));
    fault = "EIO";
    s.write(line(2));
    expect(c.closed()).toBe(1);
    s.close();
  });

  it("a file that cannot be opened keeps the line, with the open's error", () => {
    const s = sinkOver({ ...ops, ...refusingOpen("EACCES") });
    s.write(line(1));
    expect(s.state()).toEqual({
      writable: false,
      pendingBytes: line(1).length,
      droppedLines: 0,
      error: "EACCES: simulated failure",
    });
    s.close();
  });

  it("after close, a file that cannot be opened drops the line with the open's error", () => {
    const s = sinkOver({ ...ops, ...refusingOpen("EACCES") });
    s.close();
    s.write(line(1));
    expect(s.state()).toEqual({
      writable: false,
      pendingBytes: 0,
      droppedLines: 1,
      error: "EACCES: simulated failure",
    });
  });

  it("after close, a last line cut by a full disk counts as one dropped line", () => {
    const s = sink();
    s.close();
    room = 5;
    s.write(line(1));
    expect(s.state().droppedLines).toBe(1);
    expect(s.state().error).toBe("ENOSPC: simulated failure");
  });

  it("a last line cut by a full disk, then closed while still full, counts once", () => {
    const s = sink();
    room = 5;
    s.write(line(1));
    expect(s.state()).toMatchObject({ droppedLines: 1, pendingBytes: 0, error: "ENOSPC: simulated failure" });
    room = 0;
    s.close();
    expect(s.state().droppedLines).toBe(1);
  });

  it("keeps lines up to exactly maxPendingBytes", () => {
    const s = sink({ maxPendingBytes: 2 * line(1).length });
    fault = "EIO";
    s.write(line(1));
    s.write(line(2));
    expect(s.state()).toMatchObject({ pendingBytes: 2 * line(1).length, droppedLines: 0 });
    s.write(line(3));
    expect(s.state().droppedLines).toBe(1);
    s.close();
  });

  it("tells a failure that lasts once, not once a minute, while nothing is dropped", () => {
    const s = sink();
    fault = "EIO";
    for (let i = 0; i < 10; i++) {
      s.write("x\n");
      clock += 20_000;
    }
    expect(notices).toHaveLength(1);
    s.close();
  });

  it("tells a drop again exactly one notice interval after the last notice", () => {
    const s = sink({ maxPendingBytes: 0 });
    fault = "EIO";
    s.write(line(1));
    expect(notices).toHaveLength(1);
    clock += 59_999;
    s.write(line(2));
    expect(notices).toHaveLength(1);
    clock += 1;
    s.write(line(3));
    expect(notices).toHaveLength(2);
    expect(notices[1]).toContain("(EIO: simulated failure)");
    expect(notices[1]).toContain("3 dropped so far");
    s.close();
  });

  it("a write that throws where nothing should loses that line only, and the notice names the error", () => {
    let broken = true;
    const s = new LogFileSink(path, {
      fs: ops,
      now: () => {
        if (broken) {
          broken = false;
          throw new Error("clock broke");
        }
        return clock;
      },
      notice: (l) => notices.push(l),
    });
    expect(s.write(`${line(1)}${line(2)}`)).toBe(true);
    expect(s.state()).toMatchObject({ writable: false, droppedLines: 2, error: "clock broke" });
    expect(notices).toEqual([expect.stringContaining(`cannot write ${path} (clock broke)`)]);
    s.close();
  });

  it("its retry timer is the rate limit: it writes even when a line came just before it", async () => {
    // The clock stands still: only a forced retry may run.
    const s = new LogFileSink(path, {
      fs: ops,
      now: () => clock,
      retryMs: 20,
      notice: (l) => notices.push(l),
    });
    fault = "EROFS";
    s.write(line(1));
    fault = undefined;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(await readFile(path, "utf8")).toBe(line(1));
    s.close();
  });

  it("the retry timer does not hold the process, and stops once the file is writable again", () => {
    const s = sink();
    fault = "EROFS";
    s.write(line(1));
    const timer = (s as unknown as { retryTimer: NodeJS.Timeout | undefined }).retryTimer;
    expect(timer?.hasRef()).toBe(false);
    fault = undefined;
    clock += 1_000;
    s.write(line(2));
    expect((s as unknown as { retryTimer: NodeJS.Timeout | undefined }).retryTimer).toBeUndefined();
    s.close();
  });
});

describe("LogFileSink: a retry that the disk cuts short", () => {
  it("keeps the rest of a buffered chunk after a line cut by the retry, and writes it once the disk has room", async () => {
    const s = sink();
    fault = "EIO";
    s.write(`${line(1)}${line(2)}`);
    s.write(line(3));
    fault = undefined;
    room = 5;
    s.flushSync();
    // line 1 was cut (and counted); line 2 stays buffered with line 3.
    expect(s.state()).toMatchObject({
      writable: false,
      pendingBytes: line(2).length + line(3).length,
      droppedLines: 1,
    });
    room = undefined;
    s.flushSync();
    expect(await readFile(path, "utf8")).toBe(`${line(1).slice(0, 5)}\n${line(2)}${line(3)}`);
    expect(s.state()).toEqual({ writable: true, pendingBytes: 0, droppedLines: 1 });
    s.close();
  });

  it("drops the buffered chunk whose only line the retry cut, and keeps the next one", async () => {
    const s = sink();
    fault = "EIO";
    s.write(line(1));
    s.write(line(2));
    fault = undefined;
    room = 5;
    s.flushSync();
    expect(s.state()).toMatchObject({ pendingBytes: line(2).length, droppedLines: 1 });
    room = undefined;
    s.flushSync();
    expect(await readFile(path, "utf8")).toBe(`${line(1).slice(0, 5)}\n${line(2)}`);
    s.close();
  });
});

describe("describeFsError, anchored", () => {
  it("takes the code only from the start of the message", () => {
    const error = Object.assign(new Error("cannot open /x, EIO: i/o error"), { code: "EIO" });
    expect(describeFsError(error)).toBe("EIO: cannot open /x, EIO: i/o error");
  });
});

describe("LogFileSink: what is at the path", () => {
  it("S13 never blocks on a FIFO without a reader: refused at once, told on stderr, lines kept", () => {
    execFileSync("mkfifo", [path]);
    const started = performance.now();
    const s = sink();
    s.write(line(1));
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(s.state()).toMatchObject({ writable: false, pendingBytes: line(1).length });
    expect(s.state().error).toBe(`${path} is not a regular file`);
    expect(notices[0]).toContain(`cannot write ${path}`);
    s.close();
  });

  it("S13 writes nothing into a FIFO that has a reader: what was opened is checked, and closed again", () => {
    execFileSync("mkfifo", [path]);
    const reader = fs.openSync(path, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    try {
      const s = sink();
      s.write(line(1));
      expect(s.state()).toMatchObject({ writable: false, error: `${path} is a FIFO, not a regular file` });
      s.close();
      // Nothing came through, and no writer is left on it (an end of file, not a wait).
      expect(fs.readSync(reader, Buffer.alloc(64))).toBe(0);
    } finally {
      fs.closeSync(reader);
    }
  });

  it("S13 never follows a symlink: the file it names is untouched, and kept out of narrowLogFileMode too", async () => {
    const target = join(dir, "elsewhere");
    await writeFile(target, "precious\n", { mode: 0o644 });
    fs.chmodSync(target, 0o644);
    await symlink(target, path);
    const s = sink();
    s.write(line(1));
    s.close();
    expect(s.state().error).toBe(`${path} is a symbolic link, not a regular file`);
    narrowLogFileMode(path);
    expect(await readFile(target, "utf8")).toBe("precious\n");
    expect(fs.statSync(target).mode & 0o777).toBe(0o644);
  });

  it("narrowLogFileMode narrows a regular log file of an earlier version to 0600, and is quiet when there is none", async () => {
    await writeFile(path, "old\n");
    fs.chmodSync(path, 0o644);
    narrowLogFileMode(path);
    expect(fs.statSync(path).mode & 0o777).toBe(0o600);
    narrowLogFileMode(join(dir, "absent.log"));
    expect(fs.existsSync(join(dir, "absent.log"))).toBe(false);
  });
});
