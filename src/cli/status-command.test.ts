import { describe, expect, it } from "vitest";
import { rollbackLine } from "./status-command.js";
import { countByStatus, formatStatusReport, type ShimStatusReport } from "./task-views.js";

const report: ShimStatusReport = {
  shim: "http://127.0.0.1:10998",
  service: "dstack-shim",
  version: "1.3.3",
  implementation: "taskshim",
  engine: null,
  gpu: { vendor: null, driver_version: null, in_use: 0 },
  components: null,
  tasks: { total: 0, by_status: countByStatus([]) },
  quarantined_state_files: null,
};

describe("U16 taskshim status shows the supervisor's rollback", () => {
  it("in one line aligned with the report's fields, and nothing without one", () => {
    const rollback = {
      at: "2026-12-04T17:28:46.845Z",
      reason: "exited 78 before serving (ran 5ms)",
      binary: "/usr/local/bin/taskshim",
    };
    const text = `${formatStatusReport(report)}${rollbackLine({ ...report, rollback })}`;
    const gpus = text.split("\n").find((line) => line.startsWith("gpus:")) ?? "";
    const line = text.split("\n").at(-1) ?? "";
    expect(line).toBe(
      "rolled back:  2026-12-04T17:28:46.845Z: the new binary at /usr/local/bin/taskshim exited 78 before serving (ran 5ms); the previous one runs",
    );
    expect(line.indexOf("2026")).toBe(gpus.indexOf("none"));
    expect(rollbackLine(report)).toBe("");
  });
});
