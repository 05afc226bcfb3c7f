import type { Row, RunRecord } from "./report.js";
import { median, round } from "./stats.js";

/** A target a figure can be checked against: `<= 20 ms`, `ratio >= 0.75`, `= 1`, `0`, `<= 2 s; …`. */
interface NumericTarget {
  readonly on: "taskshim" | "ratio";
  readonly op: "<=" | ">=" | "=";
  /** In the row's own unit (a target in s of a row in ms is converted). */
  readonly value: number;
  /** The row's unit if the target wrote one (`<= 20 ms`), for writing the target again. */
  readonly unit: string | undefined;
  /** A condition after `;` (B3's "exits while down final…"): judged by each run, not by a figure. */
  readonly condition: boolean;
}

const TARGET = /^(ratio )?(<=|>=|=)?\s*(-?\d+(?:\.\d+)?)\s*(ms|s|MB|%)?\s*(;.*)?$/;

/** The numeric part of a row's target, or undefined for "reported" and the like. */
export function parseTarget(target: string, unit: string): NumericTarget | undefined {
  const match = TARGET.exec(target.trim());
  if (!match) return undefined;
  const [, ratio, op = "=", number = "", targetUnit, condition] = match;
  const scale = targetUnit === "s" && unit === "ms" ? 1000 : 1;
  return {
    on: ratio ? "ratio" : "taskshim",
    op: op as NumericTarget["op"],
    value: Number(number) * scale,
    unit: targetUnit === undefined ? undefined : unit,
    condition: condition !== undefined,
  };
}

function meets(value: number | null, target: NumericTarget): boolean {
  if (value === null) return false;
  if (target.op === "<=") return value <= target.value;
  if (target.op === ">=") return value >= target.value;
  return value === target.value;
}

/**
 * The records medians are taken over: the newest `runs` of one version (default: the newest
 * record's), all full runs, or with `only` all partial runs of exactly those benchmarks.
 */
export function chooseRuns(
  records: readonly RunRecord[],
  options: { readonly runs: number; readonly version?: string; readonly only?: readonly string[] },
): RunRecord[] {
  const wanted = options.only && [...options.only].sort().join(",");
  const kind = records
    .filter((r) => (r.only ? [...r.only].sort().join(",") : undefined) === wanted)
    .sort((a, b) => a.date.localeCompare(b.date));
  const version = options.version ?? kind.at(-1)?.version;
  return kind.filter((r) => r.version === version).slice(-options.runs);
}

/** One row of the medians table: the median of each figure over the runs, and every run's own. */
export interface MedianRow extends Row {
  /** Each run's figure (null: the run had no such row). */
  readonly runs: readonly (number | null)[];
}

function medianOf(values: readonly (number | null)[]): number | null {
  const present = values.filter((v): v is number => v !== null);
  return present.length === 0 ? null : round(median(present), 3);
}

/**
 * The rows of several runs of one version combined: each figure the median of the runs' (a ratio
 * the median of the runs' ratios), the row's name from the newest run. Rows are matched by id and
 * their order within it, since names carry figures of their run ("205 tasks", "563 sent"). The
 * pass is judged again on the median against the median of the runs' targets (B6's depends on
 * the run's idle RSS); a target with no figure ("reported"), or with a condition after `;`, also
 * needs every run that had the row to have passed it.
 */
export function combineRuns(records: readonly RunRecord[]): MedianRow[] {
  const keyed = (record: RunRecord): Map<string, Row> => {
    const seen = new Map<string, number>();
    const byKey = new Map<string, Row>();
    for (const row of record.rows) {
      const base = `${row.engine ?? "docker"}:${row.id}`;
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      byKey.set(`${base}#${n}`, row);
    }
    return byKey;
  };
  const runs = records.map(keyed);
  const keys = [...new Set(runs.flatMap((run) => [...run.keys()]))];
  return keys.map((key) => {
    const rows = runs.map((run) => run.get(key));
    const newest = rows.findLast((row) => row !== undefined)!;
    const present = rows.filter((row): row is Row => row !== undefined);
    const taskshim = medianOf(rows.map((row) => row?.taskshim ?? null))!;
    const ratio = medianOf(rows.map((row) => row?.ratio ?? null));
    const targets = present.map((row) => parseTarget(row.target, row.unit));
    let target = newest.target;
    let pass = present.every((row) => row.pass);
    // Every run's target has a figure (present is never empty: the key came from one of them).
    if (targets.every((t) => t !== undefined)) {
      const first = targets[0]!;
      const value = round(median(targets.map((t) => t.value)), 3);
      const combined: NumericTarget = { ...first, value };
      pass = meets(first.on === "ratio" ? ratio : taskshim, combined) && (!first.condition || pass);
      if (new Set(present.map((row) => row.target)).size > 1) {
        const written = `${first.on === "ratio" ? "ratio " : ""}${first.op} ${value}${first.unit ? ` ${first.unit}` : ""}`;
        target = `${written} (median of the runs' targets)`;
      }
    }
    return {
      ...newest,
      taskshim,
      baseline: medianOf(rows.map((row) => row?.baseline ?? null)),
      ratio,
      target,
      pass,
      runs: rows.map((row) => row?.taskshim ?? null),
    };
  });
}
