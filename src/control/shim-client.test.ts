import { describe, expect, it } from "vitest";
import { TASK_STATUSES } from "../tasks/task-status.js";
import { negotiateFeatures, parseShimVersion } from "./shim-client.js";
import { formatUpgradeTable } from "./upgrade.js";

describe("parseShimVersion (dstack's _parse_version)", () => {
  it("keeps a final X.Y.Z and treats anything else as the newest build", () => {
    expect(parseShimVersion("0.19.26")).toBe("0.19.26");
    expect(parseShimVersion("1.0.0")).toBe("1.0.0");
    for (const v of ["latest", "0.0.1.dev2", "1.2.0-rc.1", "1", ""]) expect(parseShimVersion(v)).toBeNull();
  });
});

describe("negotiateFeatures", () => {
  it("gates features on the version like dstack's client", () => {
    const old = negotiateFeatures({ service: "dstack-shim", version: "0.18.30" });
    expect(old).toMatchObject({ apiVersion: 1, components: false, shutdown: false, instanceHealth: false });
    const mid = negotiateFeatures({ service: "dstack-shim", version: "0.20.0" });
    expect(mid).toMatchObject({ apiVersion: 2, components: true, shutdown: false, instanceInfo: false });
    const dev = negotiateFeatures({ service: "dstack-shim", version: "latest" });
    expect(dev).toMatchObject({
      apiVersion: 2,
      components: true,
      shutdown: true,
      instanceInfo: true,
      version: null,
    });
  });

  it("passes every gate for taskshim 1.0.0, whose every status survives a restart", () => {
    const features = negotiateFeatures({
      service: "dstack-shim",
      version: "1.0.0",
      implementation: "taskshim",
    });
    expect(features).toMatchObject({
      apiVersion: 2,
      instanceHealth: true,
      instanceInfo: true,
      components: true,
      shutdown: true,
    });
    expect(features.restartSafeStatuses).toEqual(TASK_STATUSES);
  });

  it("allows only terminated for any other or unknown shim", () => {
    for (const health of [
      { service: "dstack-shim", version: "0.21.3" },
      { service: "dstack-shim", version: "1.0.0" },
      { service: "dstack-shim", version: "latest", implementation: "taskshim" },
      { service: "dstack-shim", version: "0.9.0", implementation: "taskshim" },
    ]) {
      expect(negotiateFeatures(health).restartSafeStatuses).toEqual(["terminated"]);
    }
  });
});

describe("formatUpgradeTable", () => {
  it("prints one aligned row per shim", () => {
    const table = formatUpgradeTable([
      {
        shim: "http://a",
        outcome: "upgraded",
        from: "1.0.0",
        to: "1.1.0",
        windowMs: 812,
        tasksBefore: 3,
        tasksKept: 3,
      },
      {
        shim: "http://bb",
        outcome: "failed",
        from: "1.0.0",
        to: "",
        windowMs: null,
        tasksBefore: 1,
        tasksKept: 0,
        error: "x",
      },
    ]);
    const lines = table.split("\n");
    expect(lines[0]).toMatch(/^shim\s+outcome\s+from\s+to\s+window ms\s+tasks kept\s+error$/);
    expect(lines[1]).toMatch(/^http:\/\/a\s+upgraded\s+1\.0\.0\s+1\.1\.0\s+812\s+3\/3$/);
    expect(lines[2]).toMatch(/failed .* - +0\/1 +x$/);
  });
});
