import { execFileSync } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * The GPU path end to end on a machine without GPUs: a fixture describes two AMD-style GPUs
 * whose render nodes and /dev/kfd are harmless character devices (1:3, the same as /dev/null),
 * so the engine really passes them into containers and the GPU lock is exercised for real.
 */

let shim: ShimProcess;
let images: TestImages;
let fixture: string;
let seq = 0;

function gpuTask(gpu: number, command: string[]) {
  seq += 1;
  return {
    id: `gpu-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-gpu-${seq}`,
    image_name: images.busybox,
    gpu,
    command,
  };
}

beforeAll(async () => {
  images = await ensureTestImages();
  const dir = await tempHome("taskshim-gpu-");
  for (const node of ["kfd", "renderD128", "renderD129"])
    execFileSync("mknod", [join(dir, node), "c", "1", "3"]);
  fixture = join(dir, "gpus.json");
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

describe("GPUs from an inventory fixture", () => {
  it("reports the GPU vendor and driver in instance info", async () => {
    const info = await shim.request("GET", "/api/instance/info");
    expect(info.json).toEqual({ gpu_vendor: "amd", gpu_driver_version: "6.8.5" });
  });

  it("passes a locked GPU's devices into the container and releases it at the end", async () => {
    const holder = gpuTask(1, ["sleep", "300"]);
    await shim.submit(holder);
    const running = await shim.waitTask(holder.id, (t) => t.status === "running");
    expect(running.gpus_ids).toEqual(["/dev/dri/renderD128"]);
    const info = await testDocker().getContainer(running.container_id).inspect();
    const devices = ((info.HostConfig.Devices ?? []) as { PathInContainer: string }[])
      .map((d) => d.PathInContainer)
      .sort();
    expect(devices).toEqual(["/dev/dri/renderD128", "/dev/kfd"]);

    // One GPU is left: asking for two fails with dstack-shim's message and locks nothing.
    const greedy = gpuTask(2, ["true"]);
    await shim.submit(greedy);
    const refused = await shim.waitTerminated(greedy.id);
    expect(refused.termination_reason).toBe("executor_error");
    expect(refused.termination_message).toBe("no capacity: 2 GPUs requested, 1 available");

    const second = gpuTask(1, ["sh", "-c", "ls /dev/dri; exit 1"]);
    await shim.submit(second);
    // Terminated is visible at once; the release (and its empty gpus_ids) follows.
    const done = await shim.waitTask(second.id, (t) => t.status === "terminated" && t.gpus_ids?.length === 0);
    expect(done.termination_message).toBe("renderD129");

    await shim.terminate(holder.id);
    // Both GPUs are free again: "all" (-1) takes both.
    const all = gpuTask(-1, ["sh", "-c", "ls /dev/dri; exit 1"]);
    await shim.submit(all);
    const allDone = await shim.waitTerminated(all.id);
    expect(allDone.termination_message.split("\n").sort()).toEqual(["renderD128", "renderD129"]);
  });

  it("keeps a running task's GPU locked across a shim kill and restart", async () => {
    const holder = gpuTask(2, ["sleep", "300"]);
    await shim.submit(holder);
    const running = await shim.waitTask(holder.id, (t) => t.status === "running");
    expect(running.gpus_ids).toHaveLength(2);
    await shim.kill();
    shim = await ShimProcess.start({ home: shim.home, args: ["--gpu-fixture", fixture] });
    const restored = await shim.task(holder.id);
    expect(restored.status).toBe("running");
    expect(restored.container_id).toBe(running.container_id);
    expect([...(restored.gpus_ids ?? [])].sort()).toEqual([...(running.gpus_ids ?? [])].sort());
    const blocked = gpuTask(1, ["true"]);
    await shim.submit(blocked);
    expect((await shim.waitTerminated(blocked.id)).termination_message).toBe(
      "no capacity: 1 GPUs requested, 0 available",
    );
    await shim.terminate(holder.id);
  });
});
