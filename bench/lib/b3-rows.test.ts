import { describe, expect, it } from "vitest";
import { b3Rows, type B3Figures } from "./b3-rows.js";
import { combineRuns } from "./medians.js";
import type { Row, RunRecord } from "./report.js";

const figures = (overrides: Partial<B3Figures> = {}): B3Figures => ({
  size: 200,
  victims: 10,
  times: [590, 600, 580],
  problems: [],
  oldFloorMs: 316,
  floor: { times: [250, 240, 260, 245, 255], files: 230, problems: [] },
  versionPairs: { version: [150, 160, 155], bare: [50, 52, 48] },
  ...overrides,
});

const record = (date: string, rows: readonly Row[]): RunRecord => ({
  date,
  version: "1.4.1",
  commit: "abc1234",
  node: "v26.12.1",
  engines: "Docker 20.10.24+dfsg1",
  cpus: 2,
  load: [1, 1, 1],
  seconds: 4_000,
  rows,
  notes: [],
});

describe("B3's rows", () => {
  it("keeps B3's first two rows as they were and adds the physical floor and the --version pair", () => {
    const rows = b3Rows(figures());
    expect(rows.map((r) => `${r.id} ${r.unit}`)).toEqual([
      "B3 ms",
      "B3 ratio",
      "B3 ratio",
      "B3-floor ms",
      "B3-version ms",
    ]);
    const [recovery, old, physical, floor, version] = rows;
    expect(recovery).toMatchObject({
      taskshim: 590,
      target: "<= 2 s; exits while down final before the first answer",
    });
    expect(old).toMatchObject({ taskshim: 1.87, target: "<= 2", pass: true });
    expect(old!.name).toMatch(/old floor.*= 316 ms/);
    expect(physical).toMatchObject({ taskshim: 2.36, target: "<= 2.5", pass: true });
    expect(floor).toMatchObject({ taskshim: 250, target: "reported", pass: true });
    expect(floor!.name).toMatch(/230 task\.json/);
    expect(version).toMatchObject({
      taskshim: 155,
      baseline: 50,
      ratio: 3.1,
      target: "ratio <= 1.8",
      pass: false,
    });
  });

  it("fails the floor's row when a floor answer missed the fleet, and B3 on a problem of its own", () => {
    const rows = b3Rows(
      figures({ problems: ["1 running task missing"], floor: { times: [250], files: 1, problems: ["x"] } }),
    );
    expect(rows[0]!.pass).toBe(false);
    expect(rows[3]!.pass).toBe(false);
  });

  it("passes the physical ratio and the --version pair at their targets", () => {
    const rows = b3Rows(
      figures({
        times: [500],
        floor: { times: [200], files: 200, problems: [] },
        versionPairs: { version: [90], bare: [50] },
      }),
    );
    expect(rows[2]).toMatchObject({ taskshim: 2.5, pass: true });
    expect(rows[4]).toMatchObject({ ratio: 1.8, pass: true });
  });

  it("with the single binary measured: its rows hold the targets, the bundle's ratios are reported", () => {
    const rows = b3Rows(
      figures({
        binary: { times: [400, 380, 420], problems: [] },
        versionPairs: { version: [150, 160, 155], binary: [70, 80, 90], bare: [50, 52, 48] },
      }),
    );
    expect(rows.map((r) => `${r.id} ${r.unit}`)).toEqual([
      "B3 ms",
      "B3 ratio",
      "B3 ratio",
      "B3-floor ms",
      "B3-version ms",
      "B3-version ms",
      "B3-binary ms",
      "B3-binary ratio",
    ]);
    const [, , physical, , version, binaryVersion, binary, binaryRatio] = rows;
    expect(physical).toMatchObject({ taskshim: 2.36, pass: true });
    expect(physical!.target).toMatch(/^reported/);
    expect(version).toMatchObject({ ratio: 3.1, pass: true });
    expect(version!.target).toMatch(/^reported/);
    expect(binaryVersion).toMatchObject({
      taskshim: 80,
      baseline: 50,
      ratio: 1.6,
      target: "ratio <= 1.8",
      pass: true,
    });
    expect(binary).toMatchObject({ taskshim: 400, pass: true });
    expect(binaryRatio).toMatchObject({ taskshim: 1.6, target: "<= 2.5", pass: true });
    expect(binaryRatio!.name).toMatch(/= 250 ms/);
  });

  it("fails the binary's rows above their targets or on a problem of its trials", () => {
    const rows = b3Rows(
      figures({
        binary: { times: [700], problems: ["2 running tasks missing"] },
        versionPairs: { version: [150], binary: [95], bare: [50] },
      }),
    );
    expect(rows.slice(5).map((r) => r.pass)).toEqual([false, false, false]);
  });

  it("judges the restarted shim's memory against B6's idle + 15 MB of the same run, or reports it", () => {
    const memoryRow = (memory: NonNullable<B3Figures["memory"]>) =>
      b3Rows(figures({ memory })).find((r) => r.id === "B3-rss");
    expect(memoryRow({ rss: 88.4, idleRss: 76.2, marginMb: 15 })).toMatchObject({
      unit: "MB",
      taskshim: 88.4,
      target: "<= 91.2 MB",
      pass: true,
    });
    expect(memoryRow({ rss: 91.3, idleRss: 76.2, marginMb: 15 })?.pass).toBe(false);
    expect(memoryRow({ rss: 120, idleRss: Number.NaN, marginMb: 15 })).toMatchObject({
      target: "reported (B6 did not run)",
      pass: true,
    });
    expect(b3Rows(figures()).some((r) => r.id === "B3-rss")).toBe(false);
  });

  it("combines with the records of runs before the physical floor: each old row matched to its own", () => {
    const before = record("2026-12-03T19:25:00Z", [
      {
        id: "B3",
        name: "recovery",
        unit: "ms",
        taskshim: 574,
        baseline: null,
        ratio: null,
        target: "<= 2 s; exits while down final before the first answer",
        pass: true,
      },
      {
        id: "B3",
        name: "old ratio",
        unit: "ratio",
        taskshim: 1.82,
        baseline: null,
        ratio: null,
        target: "<= 2",
        pass: true,
      },
    ]);
    const combined = combineRuns([before, record("2026-12-04T22:30:00Z", b3Rows(figures()))]);
    expect(combined.map((r) => [r.id, r.runs])).toEqual([
      ["B3", [574, 590]],
      ["B3", [1.82, 1.87]],
      ["B3", [null, 2.36]],
      ["B3-floor", [null, 250]],
      ["B3-version", [null, 155]],
    ]);
  });
});
