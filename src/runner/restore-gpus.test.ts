import { afterEach, describe, expect, it } from "vitest";
import type { GpuInfo, GpuInventory } from "../host/gpu-inventory.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { restoreTasks } from "./restore.js";

/*
 * After a restart, the GPUs a running container holds are read back from the engine per vendor
 * (as dstack-shim's restoreStateFromContainers does) and locked again: NVIDIA from the device
 * request, AMD and Tenstorrent from the devices, Gaudi from HABANA_VISIBLE_DEVICES in the env.
 */

const gpus = (vendor: GpuInfo["vendor"], ids: readonly string[]): GpuInfo[] =>
  ids.map((id, index) => ({ vendor, name: "x", vramMiB: 1, id, index, driverVersion: "" }));

const INVENTORIES: readonly GpuInventory[] = [
  { vendor: "nvidia", gpus: gpus("nvidia", ["GPU-a", "GPU-b", "GPU-c"]) },
  { vendor: "amd", gpus: gpus("amd", ["/dev/dri/renderD128", "/dev/dri/renderD129", "/dev/dri/renderD130"]) },
  { vendor: "tenstorrent", gpus: gpus("tenstorrent", ["0", "1", "2"]) },
  { vendor: "intel", gpus: gpus("intel", ["0", "1", "2"]) },
];

const envs: TestEnv[] = [];
afterEach(async () => {
  for (const env of envs.splice(0).reverse()) await env.dispose();
});

describe("restoreTasks reads each vendor's GPUs back from the container", () => {
  it.each(INVENTORIES.map((inventory) => [inventory.vendor, inventory] as const))(
    "%s: a running task keeps its GPUs, locked again; a new task gets only the free one",
    async (_vendor, inventory) => {
      const first = await makeContext({ inventory });
      envs.push(first);
      const holder = await first.submitAndStart({ gpu: 2 });
      expect(holder.status).toBe("running");
      expect(holder.gpuIds).toHaveLength(2);

      const next = await makeContext({ inventory, home: first.home, docker: first.docker });
      envs.push(next);
      await restoreTasks(next.ctx);
      expect(next.ctx.store.mustGet(holder.id).gpuIds).toEqual(holder.gpuIds);
      expect(next.ctx.gpuLock.lockedIds()).toEqual(holder.gpuIds);
      expect(next.ctx.gpuLock.availableCount()).toBe(1);
    },
  );

  it("intel: the env is what holds the indices (an inspect without it restores none)", async () => {
    const inventory = INVENTORIES[3] as GpuInventory;
    const first = await makeContext({ inventory });
    envs.push(first);
    const holder = await first.submitAndStart({ gpu: 1 });
    const container = first.docker.find(holder.containerId ?? "");
    expect(container?.env).toContain("HABANA_VISIBLE_DEVICES=0");
    if (container) container.env = container.env.filter((entry) => !entry.startsWith("HABANA_"));
    const next = await makeContext({ inventory, home: first.home, docker: first.docker });
    envs.push(next);
    await restoreTasks(next.ctx);
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
  });
});
