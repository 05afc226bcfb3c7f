import { describe, expect, it } from "vitest";
import { leastSquaresSlope, median, percentile } from "./stats.js";

describe("bench statistics", () => {
  it("median takes the middle value, or the mean of the two middle ones", () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(() => median([])).toThrow(/empty/);
  });

  it("percentile is nearest-rank: p99 of fewer than 100 values is the maximum", () => {
    expect(percentile([5, 1, 4, 2, 3], 50)).toBe(3);
    expect(percentile([5, 1, 4, 2, 3], 99)).toBe(5);
  });

  it("leastSquaresSlope fits a line through every point", () => {
    expect(
      leastSquaresSlope([
        [0, 1],
        [1, 3],
        [2, 5],
      ]),
    ).toBeCloseTo(2);
    // Noisy inner points count: the fit is 0.8 per unit where the two ends alone say 1.
    expect(
      leastSquaresSlope([
        [0, 0],
        [1, 2],
        [2, 1],
        [3, 3],
      ]),
    ).toBeCloseTo(0.8);
    expect(() =>
      leastSquaresSlope([
        [1, 1],
        [1, 2],
      ]),
    ).toThrow(/distinct/);
  });
});
