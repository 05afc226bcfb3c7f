import { afterEach, describe, expect, it, vi } from "vitest";
import { startHeapTrim } from "./heap-trim.js";

const MB = 1024 * 1024;

describe("startHeapTrim", () => {
  afterEach(() => vi.useRealTimers());

  it("collects once the heap's garbage exceeds the slack, and only then", () => {
    vi.useFakeTimers();
    const gc = vi.fn();
    let used = 15 * MB;
    const stop = startHeapTrim({
      intervalMs: 1_000,
      slackBytes: 4 * MB,
      gc,
      heap: () => ({ total_heap_size: 19 * MB, used_heap_size: used }),
    });
    vi.advanceTimersByTime(1_000);
    expect(gc).not.toHaveBeenCalled(); // 4 MB of garbage: not more than the slack
    used = 14 * MB;
    vi.advanceTimersByTime(999);
    expect(gc).not.toHaveBeenCalled(); // not before the interval
    vi.advanceTimersByTime(1);
    expect(gc).toHaveBeenCalledTimes(1);
    stop();
    vi.advanceTimersByTime(10_000);
    expect(gc).toHaveBeenCalledTimes(1); // stopped
  });

  it("does nothing without a gc (Node run without --expose-gc) nor a malloc trim, and keeps no timer", () => {
    vi.useFakeTimers();
    const heap = vi.fn(() => ({ total_heap_size: 100 * MB, used_heap_size: 1 * MB }));
    const stop = startHeapTrim({ intervalMs: 1_000, gc: undefined, heap });
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(5_000);
    expect(heap).not.toHaveBeenCalled();
    stop();
  });

  it("never keeps the process alive", () => {
    const timeouts = (): number => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
    const before = timeouts();
    const stop = startHeapTrim({ intervalMs: 60_000, gc: () => undefined });
    try {
      expect(timeouts()).toBe(before);
    } finally {
      stop();
    }
  });

  it("releases the C heap at the first look, after each collection and after 2 MB of growth", () => {
    vi.useFakeTimers();
    const gc = vi.fn();
    const releaseMalloc = vi.fn();
    let garbage = 1 * MB;
    let rss = 80 * MB;
    const stop = startHeapTrim({
      intervalMs: 1_000,
      slackBytes: 4 * MB,
      gc,
      heap: () => ({ total_heap_size: 20 * MB, used_heap_size: 20 * MB - garbage }),
      releaseMalloc,
      rss: () => rss,
    });
    try {
      vi.advanceTimersByTime(1_000);
      expect([gc.mock.calls.length, releaseMalloc.mock.calls.length]).toEqual([0, 1]); // start-up's
      rss += 2 * MB;
      vi.advanceTimersByTime(1_000);
      expect(releaseMalloc).toHaveBeenCalledTimes(1); // 2 MB of growth: not more than the margin
      rss += 1;
      vi.advanceTimersByTime(1_000);
      expect(releaseMalloc).toHaveBeenCalledTimes(2);
      garbage = 5 * MB;
      vi.advanceTimersByTime(1_000);
      expect([gc.mock.calls.length, releaseMalloc.mock.calls.length]).toEqual([1, 3]);
    } finally {
      stop();
    }
  });

  it("releases the C heap without a gc (Node run without --expose-gc)", () => {
    vi.useFakeTimers();
    const releaseMalloc = vi.fn();
    const stop = startHeapTrim({ intervalMs: 1_000, gc: undefined, releaseMalloc, rss: () => 80 * MB });
    vi.advanceTimersByTime(3_000);
    expect(releaseMalloc).toHaveBeenCalledTimes(1);
    stop();
  });
});
