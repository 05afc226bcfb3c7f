import { describe, expect, it } from "vitest";
import { filterTaskMetrics } from "./metric-filter.js";
import { EXPORTER_GPUS, exporterText } from "./test-support.js";

const [gpu0 = "", gpu1 = "", gpu2 = ""] = EXPORTER_GPUS;

describe("filterTaskMetrics", () => {
  it("keeps only the samples of the task's GPUs, each metric's HELP and TYPE once before them", () => {
    const out = filterTaskMetrics(exporterText(), [gpu2]);
    const lines = out.split("\n");
    expect(lines.at(-1)).toBe("");
    expect(lines.slice(0, -1)).toEqual([
      "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (%).",
      "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
      expect.stringMatching(/^DCGM_FI_DEV_GPU_UTIL\{gpu="2",UUID="GPU-3f7c5b4a-[^}]*\} 41$/),
      "# HELP DCGM_FI_DEV_FB_USED Used framebuffer memory (MiB).",
      "# TYPE DCGM_FI_DEV_FB_USED gauge",
      expect.stringMatching(/^DCGM_FI_DEV_FB_USED\{gpu="2",[^}]*\} 2048$/),
      "# HELP DCGM_FI_DEV_XID_ERRORS The last XID error seen.",
      "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
      expect.stringMatching(/^DCGM_FI_DEV_XID_ERRORS\{gpu="2",.*err_code="79".*\} 79$/),
      "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Energy consumed since boot (mJ).",
      "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
      expect.stringMatching(/^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{gpu="2",[^}]*\} 3000000$/),
    ]);
    expect(out).not.toContain(gpu0);
    expect(out).not.toContain(gpu1);
  });

  it("drops a metric's HELP and TYPE when none of its samples is the task's (GPU 0 has no XID sample)", () => {
    const out = filterTaskMetrics(exporterText(), [gpu0, gpu1]);
    expect(out).not.toContain("DCGM_FI_DEV_XID_ERRORS");
    expect(out).not.toContain(gpu2);
    // Two GPUs: the HELP and TYPE lines once, then both samples.
    const util = out.split("\n").filter((l) => l.includes("DCGM_FI_DEV_GPU_UTIL"));
    expect(util[0]).toMatch(/^# HELP /);
    expect(util[1]).toMatch(/^# TYPE /);
    expect(util.slice(2).map((l) => l.slice(l.lastIndexOf(" ") + 1))).toEqual(["93", "0"]);
    expect(util).toHaveLength(4);
    expect(out.split("\n").filter((l) => l.startsWith("DCGM_")).length).toBe(6);
  });

  it("drops free comments and blank lines, and trims each line", () => {
    const out = filterTaskMetrics(`  # HELP M m\n\n# TYPE M gauge\n# free\n   M{UUID="${gpu1}"} 1   \n`, [
      gpu1,
    ]);
    expect(out).toBe(`# HELP M m\n# TYPE M gauge\nM{UUID="${gpu1}"} 1\n`);
  });

  it("answers nothing for a task without GPUs, an empty id, or an exporter that is empty", () => {
    expect(filterTaskMetrics(exporterText(), [])).toBe("");
    expect(filterTaskMetrics(exporterText(), [""])).toBe("");
    expect(filterTaskMetrics("", [gpu0])).toBe("");
    expect(filterTaskMetrics(exporterText(), ["GPU-not-on-this-host"])).toBe("");
  });

  it("reads CRLF answers as LF ones", () => {
    const out = filterTaskMetrics(exporterText().replace(/\n/g, "\r\n"), [gpu0]);
    expect(out).toBe(filterTaskMetrics(exporterText(), [gpu0]));
    expect(out).not.toContain("\r");
  });
});
