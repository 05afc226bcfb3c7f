import { afterEach, describe, expect, it } from "vitest";
import type { GpuInfo, GpuInventory } from "../host/gpu-inventory.js";
import { collectHostInfo, type HostFacts } from "../host/host-info.js";
import { buildTestApi } from "../testing/test-api.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { VERSION } from "../version.js";
import { ShimMetrics } from "./metrics.js";

/*
 * Every answer that names the host's accelerator vendor says dstack's word for it: the instance
 * info a dstack server reads, `host_info.json`, and the metrics.
 */

const gpus = (vendor: GpuInfo["vendor"], name: string, vramMiB: number, count: number, driverVersion = "") =>
  Array.from({ length: count }, (_, index) => ({
    vendor,
    name,
    vramMiB,
    id: String(index),
    index,
    driverVersion,
  }));

const GAUDI: GpuInventory = { vendor: "intel", gpus: gpus("intel", "HL-225", 98304, 8) };
const TENSTORRENT: GpuInventory = {
  vendor: "tenstorrent",
  gpus: gpus("tenstorrent", "n300", 24576, 4, "2.0.0"),
};
const NONE: GpuInventory = { vendor: "none", gpus: [] };

const facts: HostFacts = {
  cpus: () => 64,
  memoryBytes: () => 1_000_000_000,
  addresses: () => Promise.resolve(["10.0.0.5/24"]),
  availableBytes: () => Promise.resolve(1_000),
};
const engine = { storageRoot: () => Promise.resolve("/var/lib/docker") };

let env: TestEnv | undefined;
afterEach(async () => {
  await env?.dispose();
  env = undefined;
});

describe("the vendor in every answer", () => {
  it.each([
    ["intel", GAUDI, { gpu_vendor: "intel", gpu_driver_version: "" }],
    ["tenstorrent", TENSTORRENT, { gpu_vendor: "tenstorrent", gpu_driver_version: "2.0.0" }],
    ["none", NONE, {}],
  ] as const)("GET /api/instance/info on a %s host", async (_vendor, inventory, answer) => {
    env = await makeContext({ inventory });
    const app = buildTestApi(env);
    const res = await app.inject({ method: "GET", url: "/api/instance/info" });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual(answer);
    await app.close();
  });

  it("host_info.json takes the inventory's vendor, and the first GPU's name and memory", async () => {
    expect((await collectHostInfo(GAUDI, facts, engine)).info).toMatchObject({
      gpu_vendor: "intel",
      gpu_name: "HL-225",
      gpu_memory: 98304,
      gpu_count: 8,
    });
    expect((await collectHostInfo(TENSTORRENT, facts, engine)).info).toMatchObject({
      gpu_vendor: "tenstorrent",
      gpu_name: "n300",
      gpu_memory: 24576,
      gpu_count: 4,
    });
  });

  it("taskshim_gpus names the vendor: one series, replaced when set again", async () => {
    const metrics = new ShimMetrics(undefined, VERSION);
    expect(await metrics.exposition()).not.toMatch(/^taskshim_gpus\{/m);
    metrics.setGpus(TENSTORRENT);
    expect((await metrics.exposition()).match(/^taskshim_gpus\{.*$/gm)).toEqual([
      'taskshim_gpus{vendor="tenstorrent"} 4',
    ]);
    metrics.setGpus(GAUDI);
    expect((await metrics.exposition()).match(/^taskshim_gpus\{.*$/gm)).toEqual([
      'taskshim_gpus{vendor="intel"} 8',
    ]);
    metrics.setGpus(NONE);
    expect((await metrics.exposition()).match(/^taskshim_gpus\{.*$/gm)).toEqual([
      'taskshim_gpus{vendor="none"} 0',
    ]);
  });
});
