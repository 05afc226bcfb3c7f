import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { OperationBound } from "./operation-bound.js";

describe("OperationBound", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.setSystemTime(new Date("2025-01-01T00:00:00Z"));
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("an unbounded operation has no remainder and never expires", () => {
    const bound = OperationBound.unbounded();
    expect(bound.remainingMs()).toBeUndefined();
    vi.advanceTimersByTime(10 ** 9);
    expect(bound.remainingMs()).toBeUndefined();
    expect(bound.expired()).toBe(false);
    expect(bound.elapsedMs()).toBe(10 ** 9);
  });

  it("an unbounded operation is bounded by the attempt cap alone", () => {
    const bound = OperationBound.unbounded();
    expect(bound.remainingMs(750)).toBe(750);
    expect(bound.remainingMs(0)).toBe(0);
    expect(bound.remainingMs(-5)).toBe(0);
  });

  it("counts down within its deadline", () => {
    const bound = OperationBound.within(1_000);
    expect(bound.remainingMs()).toBe(1_000);
    vi.advanceTimersByTime(400);
    expect(bound.elapsedMs()).toBe(400);
    expect(bound.remainingMs()).toBe(600);
    expect(bound.expired()).toBe(false);
    vi.advanceTimersByTime(600);
    expect(bound.remainingMs()).toBe(0);
    expect(bound.expired()).toBe(true);
    vi.advanceTimersByTime(5_000);
    expect(bound.remainingMs()).toBe(0);
    expect(bound.elapsedMs()).toBe(6_000);
  });

  it("takes the smaller of the remainder and the attempt cap", () => {
    const bound = OperationBound.within(1_000);
    expect(bound.remainingMs(300)).toBe(300);
    vi.advanceTimersByTime(800);
    // A cap never extends an attempt past the operation's deadline.
    expect(bound.remainingMs(300)).toBe(200);
    expect(bound.remainingMs(10_000)).toBe(200);
    expect(bound.remainingMs(-1)).toBe(0);
  });

  it("a bound of zero or less is expired at once", () => {
    expect(OperationBound.within(0).expired()).toBe(true);
    expect(OperationBound.within(-50).remainingMs()).toBe(0);
    expect(OperationBound.within(-50).remainingMs(100)).toBe(0);
    expect(OperationBound.within(1).expired()).toBe(false);
  });
});
