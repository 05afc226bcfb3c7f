import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { GpuFixtureError, loadGpuFixture } from "./gpu-inventory.js";

/* The NVIDIA form of a GPU fixture: GPUs by UUID, no device node (a device request carries them). */

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gpu-fixture-nvidia-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function load(content: unknown) {
  const path = join(dir, "gpus.json");
  await writeFile(path, JSON.stringify(content));
  return { path, loaded: loadGpuFixture(path) };
}

const gpu = (uuid: string) => ({ name: "NVIDIA H100 80GB HBM3", vram_mib: 81_559, uuid });

describe("an NVIDIA GPU fixture", () => {
  it("gives each GPU its UUID as id and its position as index, without device overrides", async () => {
    const { loaded } = await load({
      vendor: "nvidia",
      driver_version: "570.86.15",
      gpus: [gpu("GPU-aaaa-1"), gpu("GPU-bbbb-2")],
    });
    expect(await loaded).toEqual({
      vendor: "nvidia",
      gpus: [
        {
          vendor: "nvidia",
          name: "NVIDIA H100 80GB HBM3",
          vramMiB: 81_559,
          id: "GPU-aaaa-1",
          index: 0,
          driverVersion: "570.86.15",
        },
        {
          vendor: "nvidia",
          name: "NVIDIA H100 80GB HBM3",
          vramMiB: 81_559,
          id: "GPU-bbbb-2",
          index: 1,
          driverVersion: "570.86.15",
        },
      ],
    });
  });

  it("refuses a UUID twice, one that is not nvidia-smi's form, and an unknown key", async () => {
    const twice = await load({ vendor: "nvidia", driver_version: "", gpus: [gpu("GPU-a"), gpu("GPU-a")] });
    await expect(twice.loaded).rejects.toThrow(
      `invalid GPU fixture ${twice.path}: GPU uuids must be distinct`,
    );
    const bad = await load({ vendor: "nvidia", driver_version: "", gpus: [gpu("/dev/nvidia0")] });
    await expect(bad.loaded).rejects.toBeInstanceOf(GpuFixtureError);
    const node = await load({
      vendor: "nvidia",
      driver_version: "",
      gpus: [{ ...gpu("GPU-a"), render_node: "/r" }],
    });
    await expect(node.loaded).rejects.toBeInstanceOf(GpuFixtureError);
  });
});
