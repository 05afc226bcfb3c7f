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

  it("does nothing without a gc (Node run without --expose-gc) and keeps no timer", () => {
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
});
