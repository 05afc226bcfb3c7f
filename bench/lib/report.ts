import { mkdir, writeFile } from "node:fs/promises";
import { dirname } from "node:path";

/** One row of the results table and of `bench/results/latest.json`. */
export interface Row {
  readonly id: string;
  readonly name: string;
  readonly unit: string;
  readonly taskshim: number;
  /** The same work done without the shim, measured in the same run; null where there is none. */
  readonly baseline: number | null;
  /** taskshim / baseline; null where there is no baseline. */
  readonly ratio: number | null;
  readonly target: string;
  readonly pass: boolean;
}

/** A row whose ratio is computed (rounded to 3 decimals) from the two figures. */
export function ratioRow(fields: Omit<Row, "ratio">): Row {
  const ratio =
    fields.baseline === null || fields.baseline === 0
      ? null
      : Math.round((fields.taskshim / fields.baseline) * 1000) / 1000;
  return { ...fields, ratio };
}

function cell(value: number | null): string {
  return value === null ? "—" : String(value);
}

/** The results as a markdown table. */
export function markdownTable(rows: readonly Row[]): string {
  const header = "| id | benchmark | unit | taskshim | baseline | ratio | target | pass |";
  const rule = "|---|---|---|--:|--:|--:|---|:-:|";
  const lines = rows.map(
    (r) =>
      `| ${r.id} | ${r.name.replaceAll("|", "\\|")} | ${r.unit} | ${cell(r.taskshim)} | ${cell(r.baseline)} | ` +
      `${cell(r.ratio)} | ${r.target.replaceAll("|", "\\|")} | ${r.pass ? "✅" : "❌"} |`,
  );
  return [header, rule, ...lines].join("\n");
}

/** Writes the rows as a JSON array (the contract of `bench/results/latest.json`). */
export async function writeResults(path: string, rows: readonly Row[]): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const ordered = rows.map(({ id, name, unit, taskshim, baseline, ratio, target, pass }) => ({
    id,
    name,
    unit,
    taskshim,
    baseline,
    ratio,
    target,
    pass,
  }));
  await writeFile(path, `${JSON.stringify(ordered, null, 2)}\n`);
}
