/** The median of a non-empty sample (the mean of the two middle values for an even count). */
export function median(values: readonly number[]): number {
  if (values.length === 0) throw new Error("median of an empty sample");
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/**
 * The p-th percentile (0..100) by the nearest-rank method: the smallest value such that at
 * least p % of the sample is at or below it. p99 of fewer than 100 values is the maximum.
 */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) throw new Error("percentile of an empty sample");
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1]!;
}

/** Rounds to `digits` decimals (for the table and the JSON). */
export function round(value: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/** A one-line summary of a sample: n, min, p50, p90, p99, max. */
export function describe(values: readonly number[], unit: string, digits = 1): string {
  if (values.length === 0) return "n=0";
  const f = (v: number): string => `${round(v, digits)}${unit}`;
  return (
    `n=${values.length} min=${f(Math.min(...values))} p50=${f(median(values))} ` +
    `p90=${f(percentile(values, 90))} p99=${f(percentile(values, 99))} max=${f(Math.max(...values))}`
  );
}

/**
 * The slope of the least-squares line through `points` ([x, y] pairs, at least two distinct x):
 * how much y grows per unit of x, from every point rather than the two ends.
 */
export function leastSquaresSlope(points: readonly (readonly [number, number])[]): number {
  const n = points.length;
  const meanX = points.reduce((sum, [x]) => sum + x, 0) / n;
  const meanY = points.reduce((sum, [, y]) => sum + y, 0) / n;
  let covariance = 0;
  let variance = 0;
  for (const [x, y] of points) {
    covariance += (x - meanX) * (y - meanY);
    variance += (x - meanX) ** 2;
  }
  if (!(variance > 0)) throw new Error("least-squares slope needs at least two distinct x");
  return covariance / variance;
}
