import { describe, expect, it } from "vitest";
import { countByStatus, formatStatusReport, type ShimStatusReport } from "./task-views.js";

/* `taskshim status` names each vendor as the shim's instance info does (dstack's words). */

const report = (vendor: string | null, driver: string | null, inUse: number): ShimStatusReport => ({
  shim: "http://127.0.0.1:10998",
  service: "dstack-shim",
  version: "1.0.0",
  implementation: "taskshim",
  engine: null,
  gpu: { vendor, driver_version: driver, in_use: inUse },
  components: null,
  tasks: { total: 0, by_status: countByStatus([]) },
  quarantined_state_files: null,
});

const gpusLine = (r: ShimStatusReport): string | undefined =>
  formatStatusReport(r)
    .split("\n")
    .find((line) => line.startsWith("gpus:"));

describe("taskshim status, gpus line", () => {
  it("names Intel Gaudi and Tenstorrent hosts by dstack's vendor strings", () => {
    expect(gpusLine(report("intel", "", 3))).toBe("gpus:         intel, 3 in use");
    expect(gpusLine(report("tenstorrent", "2.0.0", 1))).toBe(
      "gpus:         tenstorrent, driver 2.0.0, 1 in use",
    );
    expect(gpusLine(report(null, null, 0))).toBe("gpus:         none");
  });
});
