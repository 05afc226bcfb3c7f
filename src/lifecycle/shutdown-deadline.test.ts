import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { SHUTDOWN_TIMINGS, ShutdownDeadline } from "./shutdown-deadline.js";

const timings = { graceMs: 5_000, boundMs: 20_000 };

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

/** A step that settles when told to, or never. */
function step(): { promise: Promise<void>; settle: () => void } {
  let settle!: () => void;
  const promise = new Promise<void>((resolve) => (settle = resolve));
  return { promise, settle };
}

describe("U10 ShutdownDeadline", () => {
  it("is well under systemd's TimeoutStopSec=30, with a grace before the interruption", () => {
    expect(SHUTDOWN_TIMINGS.boundMs).toBeLessThanOrEqual(20_000);
    expect(SHUTDOWN_TIMINGS.graceMs).toBeLessThan(SHUTDOWN_TIMINGS.boundMs);
  });

  it("interrupts nothing when every step settles within the grace", async () => {
    const interrupt = vi.fn();
    const deadline = new ShutdownDeadline(timings, interrupt, () => Date.now());
    const a = step();
    const waiting = deadline.wait({ a: a.promise, failed: Promise.reject(new Error("x")) });
    await vi.advanceTimersByTimeAsync(1_000);
    a.settle();
    expect(await waiting).toEqual({ kind: "clean", elapsedMs: 1_000 });
    await vi.advanceTimersByTimeAsync(60_000);
    expect(interrupt).not.toHaveBeenCalled();
  });

  it("interrupts the steps in flight once the grace runs out, and ends when they settle", async () => {
    const slow = step();
    const deadline = new ShutdownDeadline(
      timings,
      () => setTimeout(slow.settle, 300),
      () => Date.now(),
    );
    const waiting = deadline.wait({ slow: slow.promise });
    await vi.advanceTimersByTimeAsync(5_300);
    expect(await waiting).toEqual({ kind: "interrupted", elapsedMs: 5_300, interruptedAtMs: 5_000 });
  });

  it("ends at the bound with the steps that never settled named, having interrupted them once", async () => {
    const interrupt = vi.fn();
    const deadline = new ShutdownDeadline(timings, interrupt, () => Date.now());
    const done = step();
    const waiting = deadline.wait({ installs: new Promise(() => undefined), starts: done.promise });
    done.settle();
    deadline.interruptNow(); // a second signal: no more grace
    deadline.interruptNow();
    await vi.advanceTimersByTimeAsync(20_000);
    expect(await waiting).toEqual({
      kind: "deadline",
      elapsedMs: 20_000,
      interruptedAtMs: 0,
      unfinished: ["installs"],
    });
    expect(interrupt).toHaveBeenCalledTimes(1);
  });
});
