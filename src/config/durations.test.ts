import { describe, expect, it } from "vitest";
import { durationFlag, formatDuration, parseDuration } from "./durations.js";

describe("parseDuration", () => {
  it("reads ms, s, m, h and a bare number as seconds", () => {
    expect(parseDuration("500ms")).toBe(500);
    expect(parseDuration("10s")).toBe(10_000);
    expect(parseDuration("2m")).toBe(120_000);
    expect(parseDuration("1h")).toBe(3_600_000);
    expect(parseDuration("10")).toBe(10_000);
    expect(parseDuration("1.5s")).toBe(1_500);
    expect(parseDuration("0")).toBe(0);
  });

  it("refuses anything else", () => {
    for (const bad of ["abc", "", "-1", "10 s", "5d", "1e3", "s"]) {
      expect(() => parseDuration(bad), bad).toThrow(/expected a duration like 10s/);
    }
  });

  it("checks the range of a flag", () => {
    expect(durationFlag(100, 60_000)("1m")).toBe(60_000);
    expect(() => durationFlag(100, 60_000)("2m")).toThrow("expected a duration from 100ms to 1m");
  });

  it("formats the shortest exact spelling", () => {
    expect(formatDuration(250)).toBe("250ms");
    expect(formatDuration(1_500)).toBe("1.5s");
    expect(formatDuration(120_000)).toBe("2m");
    expect(formatDuration(0)).toBe("0s");
  });
});
