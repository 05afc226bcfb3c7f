import { getEventListeners } from "node:events";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DeadlineExceededError, linkedSignal, withDeadline } from "./linked-signal.js";

const listeners = (signal: AbortSignal): number => getEventListeners(signal, "abort").length;

describe("linkedSignal", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("propagates a parent abort with the parent's reason", () => {
    const parent = new AbortController();
    const linked = linkedSignal(parent.signal, 10_000);
    expect(linked.signal.aborted).toBe(false);
    const reason = new Error("shutting down");
    parent.abort(reason);
    expect(linked.signal.aborted).toBe(true);
    expect(linked.signal.reason).toBe(reason);
    linked.dispose();
  });

  it("aborts with DeadlineExceededError when its own timeout fires", () => {
    const parent = new AbortController();
    const linked = linkedSignal(parent.signal, 250);
    vi.advanceTimersByTime(249);
    expect(linked.signal.aborted).toBe(false);
    vi.advanceTimersByTime(1);
    expect(linked.signal.aborted).toBe(true);
    expect(linked.signal.reason).toBeInstanceOf(DeadlineExceededError);
    expect((linked.signal.reason as DeadlineExceededError).timeoutMs).toBe(250);
    expect(parent.signal.aborted).toBe(false);
    linked.dispose();
  });

  it("times out without a parent", () => {
    const linked = linkedSignal(undefined, 100);
    vi.advanceTimersByTime(100);
    expect(linked.signal.reason).toBeInstanceOf(DeadlineExceededError);
  });

  it("never aborts without a parent or a timeout", () => {
    const linked = linkedSignal(undefined);
    vi.advanceTimersByTime(1_000_000);
    expect(linked.signal.aborted).toBe(false);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("dispose removes the parent listener and clears the timer", () => {
    const parent = new AbortController();
    const before = listeners(parent.signal);
    const linked = linkedSignal(parent.signal, 500);
    expect(listeners(parent.signal)).toBe(before + 1);
    expect(vi.getTimerCount()).toBe(1);
    linked.dispose();
    expect(listeners(parent.signal)).toBe(before);
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(1_000);
    parent.abort(new Error("late"));
    expect(linked.signal.aborted).toBe(false);
  });

  it("does not accumulate listeners over many linked calls", () => {
    const parent = new AbortController();
    for (let i = 0; i < 1_000; i++) linkedSignal(parent.signal, 1_000).dispose();
    expect(listeners(parent.signal)).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("dispose after the timeout fired still removes the parent listener", () => {
    const parent = new AbortController();
    const linked = linkedSignal(parent.signal, 10);
    vi.advanceTimersByTime(10);
    expect(listeners(parent.signal)).toBe(1);
    linked.dispose();
    expect(listeners(parent.signal)).toBe(0);
  });

  it("is disposed by `using`", () => {
    const parent = new AbortController();
    {
      using linked = linkedSignal(parent.signal, 100);
      expect(linked.signal.aborted).toBe(false);
      expect(listeners(parent.signal)).toBe(1);
    }
    expect(listeners(parent.signal)).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("aborts at once, with the parent's reason, when the parent is already aborted", () => {
    const parent = new AbortController();
    const reason = new Error("already gone");
    parent.abort(reason);
    const linked = linkedSignal(parent.signal, 5_000);
    expect(linked.signal.aborted).toBe(true);
    expect(linked.signal.reason).toBe(reason);
    expect(listeners(parent.signal)).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
    linked.dispose();
  });
});

describe("withDeadline", () => {
  it("hands fn the linked signal and disposes it after success", async () => {
    const parent = new AbortController();
    let seen: AbortSignal | undefined;
    const value = await withDeadline(parent.signal, 10_000, (signal) => {
      seen = signal;
      expect(listeners(parent.signal)).toBe(1);
      return Promise.resolve(42);
    });
    expect(value).toBe(42);
    expect(seen?.aborted).toBe(false);
    expect(listeners(parent.signal)).toBe(0);
  });

  it("disposes after a failure and rethrows it", async () => {
    const parent = new AbortController();
    await expect(
      withDeadline(parent.signal, 10_000, () => Promise.reject(new Error("boom"))),
    ).rejects.toThrow("boom");
    expect(listeners(parent.signal)).toBe(0);
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
