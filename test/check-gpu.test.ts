import { execFile, execFileSync } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { bundleLaunch, SHIM_BUNDLE, ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * `taskshim check-gpu` end to end against a built shim with an AMD fixture (two render nodes and
 * /dev/kfd as harmless character devices, as test/gpu.test.ts): the real engine runs its tasks,
 * the real lock refuses and releases. The image has no amd-smi, so the tool rows are skipped, not
 * passed; there is no DCGM on AMD.
 */

let shim: ShimProcess;
let images: TestImages;

beforeAll(async () => {
  images = await ensureTestImages();
  const dir = await tempHome("taskshim-check-gpu-");
  for (const node of ["kfd", "renderD128", "renderD129"])
    execFileSync("mknod", [join(dir, node), "c", "1", "3"]);
  const fixture = join(dir, "gpus.json");
  await writeFile(
    fixture,
    JSON.stringify({
      vendor: "amd",
      driver_version: "6.8.5",
      kfd_path: join(dir, "kfd"),
      gpus: [
        { name: "MI300X", vram_mib: 196608, render_node: join(dir, "renderD128") },
        { name: "MI300X", vram_mib: 196608, render_node: join(dir, "renderD129") },
      ],
    }),
  );
  shim = await ShimProcess.start({ args: ["--gpu-fixture", fixture] });
});

afterAll(async () => {
  await shim?.stop();
});

describe("taskshim check-gpu on an AMD fixture", () => {
  it("checks devices, the lock and its release through the shim, skips what it cannot see, and leaves no task", async () => {
    const launch = bundleLaunch();
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [...launch.flags, SHIM_BUNDLE, "check-gpu", "--shim", shim.url, "--image", images.busybox, "--json"],
      { env: { ...process.env, ...launch.env }, timeout: 120_000 },
    );
    const outcome = JSON.parse(stdout) as {
      kind: string;
      vendor: string;
      rows: { check: string; seen: string; result: string }[];
    };
    expect([outcome.kind, outcome.vendor]).toEqual(["checked", "amd"]);
    const results = Object.fromEntries(outcome.rows.map((r) => [r.check, `${r.result}: ${r.seen}`]));
    expect(results).toEqual({
      "all GPUs (gpu -1): the vendor's devices": "ok: 2 render nodes, the task's",
      "all GPUs (gpu -1): amd-smi list": "skipped: amd-smi is not in the image (see --image)",
      "all GPUs (gpu -1): GPUs held": "ok: 2: /dev/dri/renderD128, /dev/dri/renderD129",
      "all GPUs: GPUs released when it ends": "ok: gpus_ids []",
      "one GPU: the vendor's devices": "ok: 1 render nodes, the task's",
      "one GPU: amd-smi list": "skipped: amd-smi is not in the image (see --image)",
      "one GPU: GPUs held": "ok: /dev/dri/renderD128",
      "lock held: 2 GPU(s) asked while one runs": "ok: no capacity: 2 GPUs requested, 1 available",
      "task metrics: /metrics/tasks/{id}": "skipped: DCGM is NVIDIA's",
      "one GPU: GPUs released when it ends": "ok: gpus_ids []",
      "all 2 GPU(s) once the lock is free: the vendor's devices": "ok: 2 render nodes, the task's",
      "all 2 GPU(s) once the lock is free: amd-smi list":
        "skipped: amd-smi is not in the image (see --image)",
      "lock released: all GPUs held again": "ok: 2 GPU(s)",
      "all GPUs again: GPUs released when it ends": "ok: gpus_ids []",
    });
    const left = (await shim.request<{ tasks: { id: string }[] }>("GET", "/api/tasks")).json.tasks;
    expect(left.filter((t) => t.id.startsWith("gpucheck-"))).toEqual([]);
  });
});
