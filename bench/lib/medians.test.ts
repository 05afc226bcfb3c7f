import { describe, expect, it } from "vitest";
import { chooseRuns, combineRuns, parseTarget } from "./medians.js";
import type { Row, RunRecord } from "./report.js";

const row = (fields: Partial<Row> & Pick<Row, "id" | "taskshim" | "target" | "pass">): Row => ({
  name: fields.id,
  unit: "ms",
  baseline: null,
  ratio: null,
  ...fields,
});

const run = (date: string, rows: Row[]): RunRecord => ({
  date,
  version: "1.3.4",
  commit: "abc1234",
  node: "v26.12.1",
  engines: "Docker 20.10.24+dfsg1",
  cpus: 2,
  load: [1, 1, 1],
  seconds: 4_500,
  rows,
  notes: [],
});

describe("bench medians", () => {
  it("parses the targets the benchmarks write", () => {
    expect(parseTarget("<= 20 ms", "ms")).toEqual({
      on: "taskshim",
      op: "<=",
      value: 20,
      unit: "ms",
      condition: false,
    });
    expect(parseTarget("ratio >= 0.75", "req/s")).toMatchObject({ on: "ratio", op: ">=", value: 0.75 });
    expect(parseTarget("0", "requests")).toMatchObject({ op: "=", value: 0 });
    // B3's target is in seconds of a row in milliseconds, with a condition only a run can judge.
    expect(parseTarget("<= 2 s; exits while down final before the first answer", "ms")).toEqual({
      on: "taskshim",
      op: "<=",
      value: 2_000,
      unit: "ms",
      condition: true,
    });
    expect(parseTarget("reported", "ms")).toBeUndefined();
    expect(parseTarget("— (reported; extrapolation in BENCHMARKS.md)", "s")).toBeUndefined();
  });

  it("takes each figure's median and judges the target on it, not on the runs' verdicts", () => {
    const rows = combineRuns([
      run("2026-12-03T10:00:00Z", [row({ id: "B1", taskshim: 25, target: "<= 20 ms", pass: false })]),
      run("2026-12-04T10:00:00Z", [row({ id: "B1", taskshim: 18, target: "<= 20 ms", pass: true })]),
      run("2026-12-05T10:00:00Z", [row({ id: "B1", taskshim: 19, target: "<= 20 ms", pass: true })]),
    ]);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ taskshim: 19, runs: [25, 18, 19], target: "<= 20 ms", pass: true });
  });

  it("matches rows by id and order, takes the ratio's own median, and a varying target's median", () => {
    const b6 = (taskshim: number, limit: number): Row =>
      row({ id: "B6", unit: "MB", taskshim, target: `<= ${limit} MB`, pass: taskshim <= limit });
    const b7 = (taskshim: number, baseline: number): Row =>
      row({ id: "B7", taskshim, baseline, ratio: taskshim / baseline, target: "ratio <= 1.10", pass: false });
    const rows = combineRuns([
      run("2026-12-03T10:00:00Z", [b6(76, 80), b6(92, 91.2), b7(110, 100)]),
      run("2026-12-04T10:00:00Z", [b6(75, 80), b6(90, 90.9), b7(230, 200)]),
      run("2026-12-05T10:00:00Z", [b6(77, 80), b6(91, 91.5), b7(210, 200)]),
    ]);
    expect(rows.map((r) => [r.id, r.taskshim, r.target, r.pass])).toEqual([
      ["B6", 76, "<= 80 MB", true],
      ["B6", 91, "<= 91.2 MB (median of the runs' targets)", true],
      // Ratios 1.1, 1.15, 1.05: median 1.1, though the runs' own verdicts all said no.
      ["B7", 210, "ratio <= 1.10", true],
    ]);
    expect(rows[2]?.ratio).toBe(1.1);
  });

  it("needs every run to pass a target with no figure or with a condition", () => {
    const rows = combineRuns([
      run("2026-12-03T10:00:00Z", [
        row({ id: "B3", taskshim: 600, target: "<= 2 s; exits while down final", pass: false }),
        row({ id: "B9", taskshim: 140, target: "reported", pass: true }),
      ]),
      run("2026-12-04T10:00:00Z", [
        row({ id: "B3", taskshim: 650, target: "<= 2 s; exits while down final", pass: true }),
        row({ id: "B9", taskshim: 150, target: "reported", pass: true }),
      ]),
    ]);
    expect(rows.map((r) => [r.id, r.taskshim, r.pass])).toEqual([
      ["B3", 625, false],
      ["B9", 145, true],
    ]);
  });

  it("chooses the newest runs of one version: full runs, or partial runs of exactly the benchmarks asked", () => {
    const at = (date: string, version: string, only?: string[]): RunRecord => ({
      ...run(date, []),
      version,
      ...(only ? { only } : {}),
    });
    const records = [
      at("2026-12-04T10:00:00Z", "1.4.1"),
      at("2026-12-04T11:00:00Z", "1.5.0", ["B3", "B8"]),
      at("2026-12-04T12:00:00Z", "1.5.0", ["B8", "B3"]),
      at("2026-12-04T13:00:00Z", "1.5.0", ["B3"]),
      at("2026-12-04T09:00:00Z", "1.5.0"),
      at("2026-12-04T14:00:00Z", "1.5.0", ["B3", "B8"]),
    ];
    const dates = (chosen: RunRecord[]): string[] => chosen.map((r) => r.date.slice(11, 13));
    // Full runs only, of the newest full run's version unless one is named.
    expect(dates(chooseRuns(records, { runs: 3 }))).toEqual(["10"]);
    expect(dates(chooseRuns(records, { runs: 3, version: "1.5.0" }))).toEqual(["09"]);
    expect(dates(chooseRuns(records, { runs: 2, only: ["B8", "B3"] }))).toEqual(["12", "14"]);
    expect(dates(chooseRuns(records, { runs: 3, only: ["B3"] }))).toEqual(["13"]);
    expect(chooseRuns(records, { runs: 3, only: ["B6"] })).toEqual([]);
  });
});
