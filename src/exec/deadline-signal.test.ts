import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DeadlineExceededError, deadlineSignal, withDeadline } from "./deadline-signal.js";

describe("deadlineSignal", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("propagates a parent abort with the parent's reason", () => {
    const parent = new AbortController();
    const deadline = deadlineSignal(parent.signal, 10_000);
    expect(deadline.signal.aborted).toBe(false);
    const reason = new Error("shutting down");
    parent.abort(reason);
    expect(deadline.signal.aborted).toBe(true);
    expect(deadline.signal.reason).toBe(reason);
    deadline.dispose();
  });

  it("aborts with DeadlineExceededError when its deadline passes, leaving the parent alone", () => {
    const parent = new AbortController();
    const deadline = deadlineSignal(parent.signal, 250);
    vi.advanceTimersByTime(249);
    expect(deadline.signal.aborted).toBe(false);
    vi.advanceTimersByTime(1);
    expect(deadline.signal.aborted).toBe(true);
    expect(deadline.signal.reason).toBeInstanceOf(DeadlineExceededError);
    expect((deadline.signal.reason as DeadlineExceededError).timeoutMs).toBe(250);
    expect((deadline.signal.reason as Error).name).toBe("DeadlineExceededError");
    expect((deadline.signal.reason as Error).message).toBe("deadline of 250 ms exceeded");
    expect(parent.signal.aborted).toBe(false);
  });

  it("times out without a parent", () => {
    const deadline = deadlineSignal(undefined, 100);
    vi.advanceTimersByTime(100);
    expect(deadline.signal.reason).toBeInstanceOf(DeadlineExceededError);
  });

  it("never aborts without a parent or a deadline, and sets no timer", () => {
    const deadline = deadlineSignal(undefined);
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(1_000_000);
    expect(deadline.signal.aborted).toBe(false);
  });

  it("dispose clears the timer: a settled call is never aborted later", () => {
    const parent = new AbortController();
    const deadline = deadlineSignal(parent.signal, 500);
    expect(vi.getTimerCount()).toBe(1);
    deadline.dispose();
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(1_000);
    expect(deadline.signal.aborted).toBe(false);
  });

  it("is disposed by `using`", () => {
    {
      using deadline = deadlineSignal(undefined, 100);
      expect(deadline.signal.aborted).toBe(false);
      expect(vi.getTimerCount()).toBe(1);
    }
    expect(vi.getTimerCount()).toBe(0);
  });

  it("aborts at once, with the parent's reason, when the parent is already aborted", () => {
    const parent = new AbortController();
    const reason = new Error("already gone");
    parent.abort(reason);
    const deadline = deadlineSignal(parent.signal, 5_000);
    expect(deadline.signal.aborted).toBe(true);
    expect(deadline.signal.reason).toBe(reason);
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe("withDeadline", () => {
  it("hands fn the signal and clears the deadline after success", async () => {
    vi.useFakeTimers();
    try {
      const parent = new AbortController();
      const value = await withDeadline(parent.signal, 10_000, (signal) => {
        expect(signal.aborted).toBe(false);
        expect(vi.getTimerCount()).toBe(1);
        return Promise.resolve(42);
      });
      expect(value).toBe(42);
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it("clears the deadline after a failure and rethrows it", async () => {
    vi.useFakeTimers();
    try {
      await expect(withDeadline(undefined, 10_000, () => Promise.reject(new Error("boom")))).rejects.toThrow(
        "boom",
      );
      expect(vi.getTimerCount()).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it("aborts fn's signal when the deadline passes", async () => {
    const reason = await withDeadline(
      undefined,
      20,
      (signal) =>
        new Promise<unknown>((resolve) => signal.addEventListener("abort", () => resolve(signal.reason))),
    );
    expect(reason).toBeInstanceOf(DeadlineExceededError);
  });
});

/*
 * The reason this module may use AbortSignal.any at all: on Node 20 every signal it linked to a
 * parent stayed referenced by that parent (~56 MB per million), so the shutdown signal of a
 * long-running shim grew without bound. A child process on the Node.js running these tests (the
 * pinned one; the module is loaded with its native type stripping) links a million deadlines to one
 * parent, as withDeadline does for engine calls, and reports its heap after a forced GC.
 */
describe("a million deadlines on one long-lived parent", () => {
  const child = `
    const { withDeadline } = await import(${JSON.stringify(new URL("./deadline-signal.ts", import.meta.url).href)});
    const parent = new AbortController().signal;
    const settle = async () => {
      for (let i = 0; i < 3; i++) { globalThis.gc(); await new Promise((r) => setTimeout(r, 30)); }
      return process.memoryUsage().heapUsed;
    };
    const calls = async (n) => {
      for (let i = 0; i < n; i++) {
        withDeadline(parent, 10_000, (signal) => Promise.resolve(signal.aborted));
        if (i % 20_000 === 0) await new Promise((r) => setImmediate(r));
      }
    };
    await calls(50_000);
    const before = await settle();
    await calls(1_000_000);
    const after = await settle();
    console.log(JSON.stringify({ before, after }));
  `;

  it("keeps the heap flat (growth under 8 MB)", { timeout: 180_000 }, async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      ["--expose-gc", "--input-type=module", "-e", child],
      { timeout: 170_000 },
    );
    const { before, after } = JSON.parse(stdout) as { before: number; after: number };
    const growthMb = (after - before) / 2 ** 20;
    console.log(
      `${process.version}: heap ${(before / 2 ** 20).toFixed(1)} → ${(after / 2 ** 20).toFixed(1)} MB`,
    );
    expect(growthMb).toBeLessThan(8);
  });
});
