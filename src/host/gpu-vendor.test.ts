import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { detectGpuVendor, VENDOR_SIGNALS } from "./gpu-vendor.js";

/*
 * Fake /dev trees in a temp dir: each test makes the paths a host of that kind has (plain files
 * and directories stand in for the device nodes; only their existence is read).
 */

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gpu-vendor-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function tree(paths: readonly string[]): Promise<void> {
  for (const path of paths) {
    const full = join(root, path);
    await mkdir(dirname(full), { recursive: true });
    // A directory for the device dirs, a file for the nodes: detection only asks whether they exist.
    if (path === "/dev/tenstorrent" || path === "/dev/accel") await mkdir(full, { recursive: true });
    else await writeFile(full, "");
  }
}

describe("detectGpuVendor on fake device trees", () => {
  it.each([
    ["an empty /dev", [], "none"],
    ["an NVIDIA host", ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"], "nvidia"],
    ["WSL2 with NVIDIA's nvidia-smi", ["/dev/dxg", "/usr/lib/wsl/lib/nvidia-smi"], "nvidia"],
    ["WSL2 without NVIDIA's nvidia-smi", ["/dev/dxg"], "none"],
    ["a Tenstorrent host", ["/dev/tenstorrent/0", "/dev/tenstorrent/1", "/dev/hugepages-1G"], "tenstorrent"],
    ["an AMD host", ["/dev/kfd", "/dev/dri/renderD128"], "amd"],
    ["a Gaudi host", ["/dev/accel/accel0", "/dev/accel/accel_controlD0"], "intel"],
    // Unique paths decide before the shared ones: an AMD iGPU beside an NVIDIA card is an NVIDIA host.
    ["NVIDIA beside an AMD iGPU", ["/dev/kfd", "/dev/nvidiactl"], "nvidia"],
    [
      "Tenstorrent beside an AMD iGPU and an NPU",
      ["/dev/kfd", "/dev/accel/accel0", "/dev/tenstorrent/0"],
      "tenstorrent",
    ],
    ["NVIDIA beside Tenstorrent", ["/dev/tenstorrent/0", "/dev/nvidiactl"], "nvidia"],
    // Of the shared paths, /dev/kfd names its vendor and /dev/accel does not: AMD first.
    ["an AMD GPU beside an NPU", ["/dev/kfd", "/dev/accel/accel0"], "amd"],
  ])("reads %s", async (_label, paths, vendor) => {
    await tree(paths);
    await expect(detectGpuVendor({ root })).resolves.toBe(vendor);
  });

  it("checks the signals in dstack-shim's order", () => {
    expect(VENDOR_SIGNALS.map((s) => `${s.vendor}:${s.paths.join("+")}`)).toEqual([
      "nvidia:/dev/nvidiactl",
      "nvidia:/dev/dxg+/usr/lib/wsl/lib/nvidia-smi",
      "tenstorrent:/dev/tenstorrent",
      "amd:/dev/kfd",
      "intel:/dev/accel",
    ]);
  });

  it("logs a path it cannot check (not ENOENT) and takes it as absent; absence itself is silent", async () => {
    const logs: [string, object | undefined][] = [];
    const log = (msg: string, fields?: object) => logs.push([msg, fields]);
    // /dev as a file: every path under it fails with ENOTDIR, which is absence too.
    await writeFile(join(root, "dev"), "");
    await expect(detectGpuVendor({ root, log })).resolves.toBe("none");
    expect(logs).toEqual([]);
    // A symlink loop fails with ELOOP, whoever asks.
    await rm(join(root, "dev"));
    await mkdir(join(root, "dev"));
    await symlink("kfd", join(root, "dev", "kfd"));
    await expect(detectGpuVendor({ root, log })).resolves.toBe("none");
    expect(logs).toEqual([
      [
        "cannot check a device path while detecting accelerators; taken as absent",
        { path: join(root, "dev", "kfd"), error: expect.stringContaining("ELOOP") as unknown },
      ],
    ]);
  });

  it("reads the real root by default (this machine has no accelerator)", async () => {
    await expect(detectGpuVendor()).resolves.toBe("none");
  });
});
