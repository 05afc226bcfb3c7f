import { describe, expect, it } from "vitest";
import type { ShimTaskInfo } from "../control/shim-client.js";
import {
  countByStatus,
  formatPorts,
  formatStatusReport,
  formatTaskDetails,
  formatTaskTable,
  dockerStyleStatus,
  humanDuration,
  newestFirst,
  parseQuarantined,
  type ShimStatusReport,
} from "./task-views.js";

const running: ShimTaskInfo = {
  id: "0b1c2d3e-1111-2222-3333-444455556666",
  status: "running",
  termination_reason: "",
  termination_message: "",
  ports: [
    { host: 32768, container: 10999 },
    { host: 32769, container: 10022 },
  ],
  image_pull_progress: {
    downloaded_bytes: 1_500_000,
    extracted_bytes: 1_500_000,
    total_bytes: 1_500_000,
    is_total_bytes_final: true,
  },
  container_name: "train-0-0-cff1b8da",
  container_id: "0123456789abcdef0123456789abcdef",
  gpus_ids: ["GPU-a", "GPU-b"],
  name: "train-0-0",
  image_name: "ghcr.io/acme/train:v2",
  exit_code: null,
  created_at: "2026-01-01T10:00:00.000Z",
  started_at: "2026-01-01T10:00:30.000Z",
  finished_at: null,
};
const failed: ShimTaskInfo = {
  id: "t2",
  status: "terminated",
  termination_reason: "container_exited_with_error",
  termination_message: "Traceback (most recent call last):\n  boom\u001b[0m",
  ports: null,
  image_pull_progress: null,
  container_name: "job-1234abcd",
  container_id: "",
  gpus_ids: [],
  name: "job",
  image_name: "busybox",
  exit_code: 3,
  created_at: "2026-01-01T10:01:00.000Z",
  started_at: "2026-01-01T10:01:01.000Z",
  finished_at: "2026-01-01T10:03:00.000Z",
};
const NOW = Date.parse("2026-01-01T10:05:30.000Z");

describe("task views", () => {
  it("lists tasks newest first in docker's columns and words", () => {
    const lines = formatTaskTable([running, failed], NOW).split("\n");
    expect(lines[0]).toMatch(/^ID\s+NAME\s+IMAGE\s+STATUS\s+CREATED$/);
    expect(lines[1]).toMatch(/^t2\s+job\s+busybox\s+Exited \(3\) 2 minutes ago\s+4 minutes ago$/);
    expect(lines[2]).toMatch(
      /^0b1c2d3e-111\s+train-0-0\s+ghcr.io\/acme\/train:v2\s+Up 5 minutes\s+5 minutes ago$/,
    );
    expect(lines[1]?.indexOf("Exited")).toBe(lines[2]?.indexOf("Up"));
  });

  it("writes statuses as docker does, and a pull as its share of download plus extraction", () => {
    const pulling = {
      ...running,
      status: "pulling" as const,
      image_pull_progress: {
        downloaded_bytes: 100,
        extracted_bytes: 0,
        total_bytes: 100,
        is_total_bytes_final: true,
      },
    };
    expect(dockerStyleStatus(pulling, NOW)).toBe("Pulling 50%");
    expect(dockerStyleStatus({ ...pulling, image_pull_progress: null }, NOW)).toBe("Pulling");
    expect(dockerStyleStatus({ ...running, status: "creating" }, NOW)).toBe("Creating");
    expect(dockerStyleStatus({ ...failed, exit_code: null }, NOW)).toBe("Terminated 2 minutes ago");
    expect(humanDuration(500)).toBe("Less than a second");
    expect(humanDuration(61_000)).toBe("About a minute");
    expect(humanDuration(3 * 3_600_000)).toBe("3 hours");
    expect(humanDuration(3 * 86_400_000)).toBe("3 days");
  });

  it("puts tasks without a creation time last", () => {
    expect(newestFirst([{ ...failed, created_at: null }, running]).map((t) => t.id)).toEqual([
      running.id,
      "t2",
    ]);
  });

  it("formats ports", () => {
    expect(formatPorts(null)).toBe("-");
    expect(formatPorts([])).toBe("-");
    expect(formatPorts([{ host: 1, container: 2 }])).toBe("1->2");
  });

  it("shows one task's every field, the message on several lines with its escapes shown", () => {
    const text = formatTaskDetails(failed, NOW);
    expect(text).toContain("status:     terminated (Exited (3) 2 minutes ago)");
    expect(text).toContain("exit code:  3");
    expect(text).toContain("reason:     container_exited_with_error");
    expect(text).toContain("finished:   2026-01-01T10:03:00.000Z (2 minutes ago)");
    expect(text).toContain(
      `message:    Traceback (most recent call last):\n${" ".repeat(12)}  boom\\u001b[0m`,
    );
    expect(text).not.toContain("\u001b");
    expect(formatTaskDetails(running, NOW)).toContain("container:  train-0-0-cff1b8da (0123456789ab)");
    expect(formatTaskDetails(running, NOW)).toContain("exit code:  -");
    expect(formatTaskDetails(running, NOW)).toContain(
      "pull:       1.5 MB / 1.5 MB downloaded, 1.5 MB extracted",
    );
  });
});

describe("status report", () => {
  it("counts tasks by status, every status present", () => {
    expect(countByStatus([{ status: "running" }, { status: "running" }, { status: "terminated" }])).toEqual({
      pending: 0,
      preparing: 0,
      pulling: 0,
      creating: 0,
      running: 2,
      terminated: 1,
    });
  });

  it("reads the quarantine gauge from the Prometheus text", () => {
    const text = [
      "# HELP taskshim_quarantined_state_files State files set aside",
      "# TYPE taskshim_quarantined_state_files gauge",
      'taskshim_quarantined_state_files{kind="corrupt"} 2',
      'taskshim_quarantined_state_files{kind="newer-format"} 0',
      "taskshim_engine_up 1",
    ].join("\n");
    expect(parseQuarantined(text)).toEqual({ corrupt: 2, "newer-format": 0 });
    expect(parseQuarantined("taskshim_engine_up 1\n")).toBeUndefined();
  });

  it("prints the shim's state as fields", () => {
    const report: ShimStatusReport = {
      shim: "http://127.0.0.1:10998",
      service: "dstack-shim",
      version: "1.0.0",
      implementation: "taskshim",
      engine: { status: "up", since: "2025-01-01T00:00:00.000Z" },
      gpu: { vendor: "nvidia", driver_version: "570.86.15", in_use: 2 },
      components: [
        { name: "dstack-runner", version: "", status: "not-installed" },
        { name: "dstack-shim", version: "1.0.0", status: "installed" },
      ],
      tasks: { total: 3, by_status: { ...countByStatus([]), running: 1, terminated: 2 } },
      quarantined_state_files: { corrupt: 1, "newer-format": 0 },
    };
    expect(formatStatusReport(report).split("\n")).toEqual([
      "shim:         http://127.0.0.1:10998",
      "version:      1.0.0 (taskshim)",
      "engine:       up since 2025-01-01T00:00:00.000Z",
      "gpus:         nvidia, driver 570.86.15, 2 in use",
      "components:   dstack-runner not-installed, dstack-shim installed (1.0.0)",
      "tasks:        3 (1 running, 2 terminated)",
      "quarantined:  1 corrupt",
    ]);
    const bare = formatStatusReport({
      ...report,
      implementation: null,
      engine: null,
      gpu: { vendor: null, driver_version: null, in_use: 0 },
      components: null,
      tasks: { total: 0, by_status: countByStatus([]) },
      quarantined_state_files: null,
    });
    expect(bare).toContain("engine:       not reported by this shim");
    expect(bare).toContain("gpus:         none");
    expect(bare).toContain("tasks:        0\n");
    expect(bare).toContain("quarantined:  -");
    expect(bare).not.toContain("storage:");
  });

  it("prints the shim's lifecycle phase when it reports one, and no phase line for a shim that does not", () => {
    const report: ShimStatusReport = {
      shim: "http://127.0.0.1:10998",
      service: "dstack-shim",
      version: "1.2.0",
      implementation: "taskshim",
      engine: null,
      lifecycle: { phase: "draining", since: "2025-01-01T00:00:05.000Z" },
      gpu: { vendor: null, driver_version: null, in_use: 0 },
      components: null,
      tasks: { total: 0, by_status: countByStatus([]) },
      quarantined_state_files: null,
    };
    const lines = formatStatusReport(report).split("\n");
    expect(lines[2]).toBe("phase:        draining since 2025-01-01T00:00:05.000Z");
    const { lifecycle: _, ...older } = report;
    expect(formatStatusReport(older)).not.toContain("phase:");
  });

  it("names the engine a shim reports before its health, and shows a shim that does not name it as before", () => {
    const report: ShimStatusReport = {
      shim: "http://127.0.0.1:10998",
      service: "dstack-shim",
      version: "1.2.0",
      implementation: "taskshim",
      engine: { status: "up", since: "2025-01-01T00:00:00.000Z", kind: "podman", version: "4.3.1" },
      gpu: { vendor: null, driver_version: null, in_use: 0 },
      components: null,
      tasks: { total: 0, by_status: countByStatus([]) },
      quarantined_state_files: null,
    };
    expect(formatStatusReport(report)).toContain(
      "engine:       podman 4.3.1, up since 2025-01-01T00:00:00.000Z\n",
    );
    const down = {
      ...report,
      engine: {
        status: "down",
        since: "2025-01-01T00:00:00.000Z",
        error: "ECONNREFUSED",
        kind: "docker",
        version: "20.10.24+dfsg1",
      },
    };
    expect(formatStatusReport(down)).toContain(
      "engine:       docker 20.10.24+dfsg1, down since 2025-01-01T00:00:00.000Z (ECONNREFUSED)\n",
    );
    expect(formatStatusReport({ ...report, engine: { status: "unknown", kind: "docker" } })).toContain(
      "engine:       docker, unknown\n",
    );
    expect(formatStatusReport({ ...report, engine: { status: "up" } })).toContain("engine:       up\n");
  });

  it("shows the storage health a taskshim reports, with its error while degraded", () => {
    const report: ShimStatusReport = {
      shim: "http://127.0.0.1:10998",
      service: "dstack-shim",
      version: "1.0.0",
      implementation: "taskshim",
      engine: { status: "up" },
      storage: {
        status: "degraded",
        since: "2025-01-01T00:00:00.000Z",
        error: "ENOSPC: no space left on device",
      },
      gpu: { vendor: null, driver_version: null, in_use: 0 },
      components: null,
      tasks: { total: 0, by_status: countByStatus([]) },
      quarantined_state_files: null,
    };
    expect(formatStatusReport(report)).toContain(
      "storage:      degraded since 2025-01-01T00:00:00.000Z (ENOSPC: no space left on device)\n",
    );
  });
});
