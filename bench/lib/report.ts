import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { EngineKind, EngineTarget } from "./engines.js";

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
  /** The engine the row was measured on; set by {@link onEngine} (a row without one is Docker's). */
  readonly engine?: EngineKind;
}

/**
 * A benchmark's rows as measured on `engine`. Docker's keep their ids and names (the history of
 * BENCHMARKS.md compares them across runs); another engine's carry it in the id (`B1-podman`) and
 * the name (`… (Podman)`), so the table and the JSON show the two side by side.
 */
export function onEngine(rows: readonly Row[], engine: EngineTarget): Row[] {
  return rows.map((row) =>
    engine.kind === "docker"
      ? { ...row, engine: engine.kind }
      : {
          ...row,
          id: `${row.id}-${engine.kind}`,
          name: `${row.name} (${engine.label})`,
          engine: engine.kind,
        },
  );
}

/**
 * The table's order: by benchmark number (B2 before B10), then Docker's rows before another
 * engine's of the same benchmark, each engine's rows in the order measured (a stable sort).
 */
export function compareRows(a: Row, b: Row): number {
  const key = (row: Row): [number, string, number] => {
    const match = /^B(\d+)(.*?)(?:-(docker|podman))?$/.exec(row.id);
    return [
      Number(match?.[1] ?? Infinity),
      match?.[2] ?? row.id,
      (row.engine ?? "docker") === "docker" ? 0 : 1,
    ];
  };
  const [an, asuffix, aengine] = key(a);
  const [bn, bsuffix, bengine] = key(b);
  return an - bn || aengine - bengine || asuffix.localeCompare(bsuffix);
}

/** A row whose ratio is computed (rounded to 3 decimals) from the two figures. */
export function ratioRow(fields: Omit<Row, "ratio">): Row {
  const ratio =
    fields.baseline === null || fields.baseline === 0
      ? null
      : Math.round((fields.taskshim / fields.baseline) * 1000) / 1000;
  return { ...fields, ratio };
}

/** A table cell of a figure: "—" where there is none. */
export function cell(value: number | null): string {
  return value === null ? "—" : String(value);
}

/** A table cell of text: its pipes escaped. */
export function textCell(text: string): string {
  return text.replaceAll("|", "\\|");
}

/** The results as a markdown table. */
export function markdownTable(rows: readonly Row[]): string {
  const header = "| id | benchmark | unit | taskshim | baseline | ratio | target | pass |";
  const rule = "|---|---|---|--:|--:|--:|---|:-:|";
  const lines = rows.map(
    (r) =>
      `| ${r.id} | ${textCell(r.name)} | ${r.unit} | ${cell(r.taskshim)} | ${cell(r.baseline)} | ` +
      `${cell(r.ratio)} | ${textCell(r.target)} | ${r.pass ? "✅" : "❌"} |`,
  );
  return [header, rule, ...lines].join("\n");
}

/** Writes the rows as a JSON array (the contract of `bench/results/latest.json`). */
export async function writeResults(path: string, rows: readonly Row[]): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const ordered = rows.map(({ id, name, unit, taskshim, baseline, ratio, target, pass, engine }) => ({
    id,
    engine: engine ?? "docker",
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

/**
 * A run as kept in `bench/results/runs/` (committed; a partial run's in `runs/partial/`): what {@link writeResults} writes and
 * what it was measured on, so that later sessions can take medians over runs of one version
 * (`bench/medians.ts`).
 */
export interface RunRecord {
  /** When the run ended (ISO 8601, UTC). */
  readonly date: string;
  /** The shim's version (package.json) and the commit it was built from. */
  readonly version: string;
  readonly commit: string;
  readonly node: string;
  readonly engines: string;
  readonly cpus: number;
  /** The load averages at the end (1, 5, 15 min). */
  readonly load: readonly number[];
  readonly seconds: number;
  readonly rows: readonly Row[];
  readonly notes: readonly string[];
  /** The benchmarks a partial run measured (`--only`, sorted); absent for a full run. */
  readonly only?: readonly string[];
}

/** Writes `record` as `<dir>/<date>-<commit>.json`; returns that path. */
export async function writeRunRecord(dir: string, record: RunRecord): Promise<string> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, `${record.date.slice(0, 16).replace(":", "")}-${record.commit}.json`);
  await writeFile(path, `${JSON.stringify(record, null, 2)}\n`);
  return path;
}
