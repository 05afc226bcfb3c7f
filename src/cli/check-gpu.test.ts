import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ShimUnreachableError, type ShimClient, type ShimTaskInfo } from "../control/shim-client.js";
import { checkGpu, formatCheckGpu, type CheckGpuDeps } from "./check-gpu.js";

const UUID_A = "GPU-1d5a3f2e-8c41-4b7e-9a0d-5f6e7c8b9a01";
const UUID_B = "GPU-2e6b4a3f-9d52-4c8f-8b1e-6a7f8d9cab12";

/**
 * A shim in memory with two NVIDIA GPUs and dstack-shim's lock rule; its containers print what
 * the real ones would (their devices and nvidia-smi -L). `brokenLock` hands out GPUs twice.
 */
function fakeShim(options: { brokenLock?: boolean; exporter?: boolean; vendor?: string | undefined } = {}) {
  const gpus = [UUID_A, UUID_B];
  const held = new Map<string, string[]>();
  const tasks = new Map<string, ShimTaskInfo>();
  const free = () => gpus.filter((g) => options.brokenLock || ![...held.values()].flat().includes(g));
  const client = {
    instanceInfo: () => Promise.resolve(options.vendor === undefined ? {} : { gpu_vendor: options.vendor }),
    submitTask: (config: { id: string; gpu: number }) => {
      const available = free();
      const want = config.gpu === -1 ? available.length : config.gpu;
      const base = { id: config.id, termination_reason: "", termination_message: "", ports: [] };
      if (want > available.length) {
        tasks.set(config.id, {
          ...base,
          status: "terminated",
          termination_reason: "executor_error",
          termination_message: `no capacity: ${want} GPUs requested, ${available.length} available`,
          gpus_ids: [],
        } as unknown as ShimTaskInfo);
      } else {
        held.set(config.id, available.slice(0, want));
        tasks.set(config.id, {
          ...base,
          status: "running",
          gpus_ids: available.slice(0, want),
        } as unknown as ShimTaskInfo);
      }
      return Promise.resolve(tasks.get(config.id));
    },
    getTask: (id: string) => Promise.resolve({ ...tasks.get(id)! }),
    logs: (id: string) => {
      const mine = held.get(id) ?? [];
      return Promise.resolve(
        [
          "@@taskshim-devices",
          ...mine.map((_, i) => `/dev/nvidia${i}`),
          "@@taskshim-tool",
          ...mine.map((u, i) => `GPU ${i}: NVIDIA H100 80GB HBM3 (UUID: ${u})`),
          "@@rc 0",
          "@@taskshim-end",
        ].join("\n"),
      );
    },
    terminateTask: (id: string) => {
      held.delete(id);
      const task = tasks.get(id);
      if (task) tasks.set(id, { ...task, status: "terminated", gpus_ids: [] } as unknown as ShimTaskInfo);
      return Promise.resolve(tasks.get(id));
    },
    removeTask: (id: string) => {
      tasks.delete(id);
      return Promise.resolve();
    },
  };
  const deps: CheckGpuDeps = {
    client: client as unknown as ShimClient,
    shim: "http://127.0.0.1:10998",
    detectLocal: () => Promise.reject(new Error("not asked when a shim answers")),
    get: (path) => {
      if (!options.exporter)
        return Promise.resolve({ status: 404, text: "DCGM Exporter is not available\n" });
      const id = decodeURIComponent(path.split("/").at(-1) ?? "");
      const mine = held.get(id) ?? [];
      return Promise.resolve({
        status: 200,
        text: mine.map((u) => `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="${u}"} 7`).join("\n"),
      });
    },
    progress: () => undefined,
  };
  return { deps, tasks };
}

const OPTIONS = { startTimeoutMs: 5_000, metricsTimeoutMs: 200, pollMs: 1 };

describe("checkGpu", () => {
  it("passes every check on a shim whose lock and devices are right, and leaves no task behind", async () => {
    const { deps, tasks } = fakeShim({ vendor: "nvidia", exporter: true });
    const outcome = await checkGpu(deps, OPTIONS);
    expect(outcome.kind).toBe("checked");
    if (outcome.kind !== "checked") return;
    expect(outcome.rows.map((r) => [r.check, r.result])).toEqual([
      ["all GPUs (gpu -1): the vendor's devices", "ok"],
      ["all GPUs (gpu -1): nvidia-smi -L", "ok"],
      ["all GPUs (gpu -1): GPUs held", "ok"],
      ["all GPUs: GPUs released when it ends", "ok"],
      ["one GPU: the vendor's devices", "ok"],
      ["one GPU: nvidia-smi -L", "ok"],
      ["one GPU: GPUs held", "ok"],
      ["lock held: 2 GPU(s) asked while one runs", "ok"],
      ["task metrics: /metrics/tasks/{id}", "ok"],
      ["one GPU: GPUs released when it ends", "ok"],
      ["all 2 GPU(s) once the lock is free: the vendor's devices", "ok"],
      ["all 2 GPU(s) once the lock is free: nvidia-smi -L", "ok"],
      ["lock released: all GPUs held again", "ok"],
      ["all GPUs again: GPUs released when it ends", "ok"],
    ]);
    expect(outcome.rows.find((r) => r.check.startsWith("lock held"))?.seen).toBe(
      "no capacity: 2 GPUs requested, 1 available",
    );
    expect(tasks.size).toBe(0);
    expect(formatCheckGpu(outcome).split("\n").at(-1)).toBe(
      "nvidia, image nvidia/cuda:12.8.1-base-ubuntu24.04: every check passed",
    );
  });

  it("fails the lock check when a task gets GPUs another one holds", async () => {
    const { deps } = fakeShim({ vendor: "nvidia", brokenLock: true });
    const outcome = await checkGpu(deps, OPTIONS);
    if (outcome.kind !== "checked") throw new Error("checked expected");
    expect(outcome.rows.find((r) => r.check.startsWith("lock held"))).toMatchObject({
      result: "FAIL",
      seen: expect.stringMatching(/^ran with /) as string,
    });
    expect(outcome.rows.find((r) => r.check.startsWith("task metrics"))).toMatchObject({
      result: "skipped",
      seen: "DCGM Exporter is not available",
    });
    expect(formatCheckGpu(outcome)).toMatch(/1 check\(s\) failed$/);
  });

  it("says no GPU when the shim reports none, and when no shim answers on a host without GPUs", async () => {
    const { deps } = fakeShim({ vendor: undefined });
    expect(await checkGpu(deps, OPTIONS)).toEqual({
      kind: "no-gpu",
      why: "the shim at http://127.0.0.1:10998 reports no GPU",
    });
    const unreachable: CheckGpuDeps = {
      ...deps,
      client: {
        instanceInfo: () => Promise.reject(new ShimUnreachableError("connection refused")),
      } as unknown as ShimClient,
      detectLocal: () => Promise.resolve({ vendor: "none", gpus: [] }),
    };
    const outcome = await checkGpu(unreachable, OPTIONS);
    expect(formatCheckGpu(outcome)).toBe(
      "no GPU: no shim answers at http://127.0.0.1:10998, and this host has no GPU (device paths and vendor tools); nothing to check",
    );
  });

  it("refuses to pretend when the host has GPUs but no shim answers", async () => {
    const { deps } = fakeShim();
    const outcome = checkGpu(
      {
        ...deps,
        client: {
          instanceInfo: () => Promise.reject(new ShimUnreachableError("refused")),
        } as unknown as ShimClient,
        detectLocal: () =>
          Promise.resolve({
            vendor: "nvidia",
            gpus: [{ vendor: "nvidia", name: "H100", vramMiB: 1, id: UUID_A, index: 0, driverVersion: "" }],
          }),
      },
      OPTIONS,
    );
    await expect(outcome).rejects.toThrow(
      "this host has 1 nvidia GPU(s) but no shim answers at http://127.0.0.1:10998",
    );
  });
});

/** A host with an accelerator's device path (gpu-vendor.ts's signals): the no-GPU answer is not this host's. */
const hasGpu = ["/dev/nvidiactl", "/dev/dxg", "/dev/kfd", "/dev/accel", "/dev/tenstorrent"].some((p) =>
  existsSync(p),
);

describe("npm run check:gpu on this machine (no GPU)", () => {
  it.skipIf(hasGpu)("prints 'no GPU' and exits 0", { timeout: 60_000 }, async () => {
    const { stdout } = await promisify(execFile)("npm", ["run", "--silent", "check:gpu"], {
      cwd: new URL("../..", import.meta.url).pathname,
      timeout: 55_000,
    });
    expect(stdout).toMatch(/^no GPU: .*; nothing to check\n$/);
  });
});
