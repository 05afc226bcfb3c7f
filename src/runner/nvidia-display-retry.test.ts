import { afterEach, describe, expect, it } from "vitest";
import type { ContainerSpec } from "../docker/docker-client.js";
import { DockerApiError } from "../docker/docker-errors.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { taskConfig, TWO_AMD_GPUS } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { NVIDIA_MODESET_PATH } from "./nvidia-display-retry.js";

/*
 * NVIDIA on a headless host: the engine's error when nvidia-container-cli cannot mount
 * /dev/nvidia-modeset (the `display` capability asks for it) is answered by one more try without
 * `display`, with a fake engine that fails the way Docker does there.
 */

const NVIDIA: GpuInventory = {
  vendor: "nvidia",
  gpus: [0, 1].map((index) => ({
    vendor: "nvidia" as const,
    name: "NVIDIA GeForce RTX 4090",
    vramMiB: 24564,
    id: `GPU-0000000${index}-aaaa-bbbb-cccc-dddddddddddd`,
    index,
    driverVersion: "575.57.08",
  })),
};

/** What Docker answers a start when the hook cannot mount the modeset node (mapped by the adapter). */
const modesetError = (operation: string) =>
  new DockerApiError(
    `${operation}: failed to create task for container: failed to create shim task: OCI runtime create failed: ` +
      "runc create failed: unable to start container process: error during container init: error running hook #0: " +
      "error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n" +
      `nvidia-container-cli: mount error: stat failed: ${NVIDIA_MODESET_PATH}: no such file or directory: unknown`,
    500,
  );

const WITH_DISPLAY = ["gpu", "utility", "compute", "graphics", "video", "display", "compat32"];
const WITHOUT_DISPLAY = ["gpu", "utility", "compute", "graphics", "video", "compat32"];

let env: TestEnv;
let lines: string[];
afterEach(async () => {
  await env.dispose();
});

async function nvidiaHost(inventory: GpuInventory = NVIDIA): Promise<void> {
  const capture = capturingLogger();
  lines = capture.lines;
  env = await makeContext({ inventory, log: capture.log });
}

/** The capability lists of every create request, in order. */
function createdCapabilities(): unknown[] {
  return env.docker.callsOf("createContainer").map((call) => {
    const spec = call.args[0] as ContainerSpec;
    return spec.gpuRequests[0]?.capabilities[0];
  });
}

/** The log lines of one level (pino: 40 warn, 20 debug) with a message containing `text`. */
function logged(level: number, text: string): Record<string, unknown>[] {
  return lines
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((line) => line.level === level && String(line.msg).includes(text));
}

describe("NVIDIA without /dev/nvidia-modeset", () => {
  it("a start that fails on the modeset node: the container is removed and made again without display, and runs", async () => {
    await nvidiaHost();
    env.docker.failNext("startContainer", modesetError("start"));
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task.status).toBe("running");
    expect(createdCapabilities()).toEqual([WITH_DISPLAY, WITHOUT_DISPLAY]);
    const [first, second] = env.docker
      .callsOf("createContainer")
      .map((c) => (c.args[0] as ContainerSpec).name);
    expect(second).toBe(first);
    // The first container is gone (a confirmed removal); the task runs in the second.
    expect(env.docker.count("removeContainer")).toBe(1);
    expect(env.docker.containers.size).toBe(1);
    expect(env.docker.find(task.containerId ?? "")?.state).toBe("running");
    expect(task.gpuIds).toEqual([NVIDIA.gpus[0]?.id]);
    expect(logged(40, "without the display capability")).toEqual([
      expect.objectContaining({
        msg: `this host has no ${NVIDIA_MODESET_PATH}: NVIDIA containers are made without the display capability (said once per run)`,
        taskId: task.id,
        error: expect.stringContaining("stat failed: /dev/nvidia-modeset") as unknown,
      }),
    ]);
  });

  it("says so once per shim run: the next task's retry is logged at debug only", async () => {
    await nvidiaHost();
    env.docker.failNext("startContainer", modesetError("start"));
    await env.submitAndStart({ gpu: 1 });
    env.docker.failNext("startContainer", modesetError("start"));
    const second = await env.submitAndStart({ gpu: 1 });
    expect(second.status).toBe("running");
    expect(createdCapabilities()).toEqual([WITH_DISPLAY, WITHOUT_DISPLAY, WITH_DISPLAY, WITHOUT_DISPLAY]);
    expect(logged(40, "without the display capability")).toHaveLength(1);
    expect(logged(20, "retrying the container without NVIDIA's display capability")).toEqual([
      expect.objectContaining({ taskId: second.id }),
    ]);
    // A new run (another context) says it again.
    const again = capturingLogger();
    const next = await makeContext({ inventory: NVIDIA, log: again.log, docker: env.docker });
    try {
      env.docker.failNext("startContainer", modesetError("start"));
      const { config, auth } = taskConfig({ gpu: 1 });
      await next.runner.submit(config, auth);
      await next.runner.awaitStarts();
      expect(next.ctx.store.mustGet(config.id).status).toBe("running");
      const warned = again.lines.filter(
        (line) => line.includes('"level":40') && line.includes("said once per run"),
      );
      expect(warned).toHaveLength(1);
    } finally {
      await next.dispose();
    }
  });

  it("a create the engine refuses on the modeset node is made again without display", async () => {
    await nvidiaHost();
    env.docker.failNext("createContainer", modesetError("create"));
    const task = await env.submitAndStart({ gpu: 2 });
    expect(task.status).toBe("running");
    expect(createdCapabilities()).toEqual([WITH_DISPLAY, WITHOUT_DISPLAY]);
    expect(env.docker.count("removeContainer")).toBe(0);
    expect(logged(40, "without the display capability")).toHaveLength(1);
  });

  it("retries once only: a second failure ends the task with the engine's error", async () => {
    await nvidiaHost();
    env.docker
      .failNext("startContainer", modesetError("start"))
      .failNext("startContainer", modesetError("start"));
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task.status).toBe("terminated");
    expect(task.terminationReason).toBe("container_exited_with_error");
    expect(task.terminationMessage).toMatch(
      /^startContainer error: start: .*stat failed: \/dev\/nvidia-modeset/s,
    );
    expect(createdCapabilities()).toEqual([WITH_DISPLAY, WITHOUT_DISPLAY]);
  });

  it("a removal that fails before the retry ends the task and says so", async () => {
    await nvidiaHost();
    env.docker
      .failNext("startContainer", modesetError("start"))
      .failNext("removeContainer", new DockerApiError("remove: device or resource busy", 500));
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task.status).toBe("terminated");
    expect(task.terminationMessage).toBe(
      "startContainer error: remove container before retry: remove: device or resource busy",
    );
    expect(createdCapabilities()).toEqual([WITH_DISPLAY]);
  });

  it("a create without display that fails ends the task with both steps named", async () => {
    await nvidiaHost();
    env.docker.failNext("startContainer", modesetError("start")).onNext("removeContainer", () => {
      env.docker.failNext("createContainer", new DockerApiError("create: no space left on device", 500));
    });
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task.status).toBe("terminated");
    expect(task.terminationMessage).toBe(
      "startContainer error: create container without NVIDIA display capability: create: no space left on device",
    );
    // The removed container is not the task's any more.
    expect(task.containerId).toBeUndefined();
  });

  it("is not retried for another error, another vendor, explicit gpu_devices, or a task without GPUs", async () => {
    const cases: [string, GpuInventory, Record<string, unknown>, Error][] = [
      ["another error", NVIDIA, { gpu: 1 }, new DockerApiError("start: exec format error", 500)],
      ["an AMD host", TWO_AMD_GPUS, { gpu: 1 }, modesetError("start")],
      [
        "explicit gpu_devices",
        NVIDIA,
        { gpu: 1, gpu_devices: [{ path_on_host: "/dev/nvidia0", path_in_container: "/dev/nvidia0" }] },
        modesetError("start"),
      ],
      ["no GPUs", NVIDIA, {}, modesetError("start")],
    ];
    for (const [label, inventory, body, error] of cases) {
      await nvidiaHost(inventory);
      env.docker.failNext("startContainer", error);
      const task = await env.submitAndStart(body);
      expect(task.status, label).toBe("terminated");
      expect(env.docker.count("createContainer"), label).toBe(1);
      expect(env.docker.count("removeContainer"), label).toBe(0);
      expect(logged(40, "without the display capability"), label).toEqual([]);
      await env.dispose();
    }
    await nvidiaHost();
  });
});
