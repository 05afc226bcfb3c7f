import pino from "pino";
import { describe, expect, it } from "vitest";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { FakeCommandRunner } from "../testing/fake-command-runner.js";
import { prepareDcgm } from "./dcgm-setup.js";

const NVIDIA: GpuInventory = {
  vendor: "nvidia",
  gpus: [
    { vendor: "nvidia", name: "H100", vramMiB: 81_559, id: "GPU-a", index: 0, driverVersion: "570.86.15" },
  ],
};

function setup(inventory: GpuInventory, installed: readonly string[]) {
  const asked: string[] = [];
  return {
    asked,
    parts: prepareDcgm({
      inventory,
      exporterPort: 10997,
      exporterIntervalMs: 5000,
      dcgmAddress: "",
      home: "/nonexistent",
      commands: new FakeCommandRunner(),
      log: pino({ level: "silent" }),
      installed: (program) => {
        asked.push(program);
        return Promise.resolve(installed.includes(program));
      },
    }),
  };
}

describe("prepareDcgm", () => {
  it("does nothing on a host that is not NVIDIA, without looking for DCGM's programs", async () => {
    const { parts, asked } = setup({ vendor: "amd", gpus: [] }, ["dcgm-exporter", "dcgmi"]);
    const built = await parts;
    expect([built.taskMetrics, built.gpuHealth, asked]).toEqual([undefined, undefined, []]);
    await built.start(new AbortController().signal);
  });

  it("has neither part on an NVIDIA host without dcgm-exporter nor dcgmi", async () => {
    const built = await setup(NVIDIA, []).parts;
    expect([built.taskMetrics, built.gpuHealth]).toEqual([undefined, undefined]);
  });

  it("has each part whose program is installed, and null health until the first check", async () => {
    const exporterOnly = await setup(NVIDIA, ["dcgm-exporter"]).parts;
    expect(exporterOnly.taskMetrics).toBeDefined();
    expect(exporterOnly.gpuHealth).toBeUndefined();
    const healthOnly = await setup(NVIDIA, ["dcgmi"]).parts;
    expect(healthOnly.taskMetrics).toBeUndefined();
    expect(healthOnly.gpuHealth?.current()).toBeNull();
  });
});
