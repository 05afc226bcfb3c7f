import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  CommandLaunchError,
  type BoundedOutcome,
  type CommandRequest,
  type CommandRunner,
} from "../exec/run-bounded.js";
import {
  GpuDetectionError,
  GpuFixtureError,
  detectGpus,
  parseAmdSmiStatic,
  parseNvidiaSmiCsv,
} from "./gpu-inventory.js";

class FakeCommands implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  constructor(private readonly script: (argv: readonly string[]) => BoundedOutcome | Error) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const result = this.script(request.argv);
    return result instanceof Error ? Promise.reject(result) : Promise.resolve(result);
  }
  argvs(): string[] {
    return this.calls.map((call) => call.argv.join(" "));
  }
}

const exited = (code: number, stdout = "", stderr = ""): BoundedOutcome => ({
  kind: "exited",
  code,
  signal: null,
  stdout: Buffer.from(stdout),
  stderr: Buffer.from(stderr),
});
const expired: BoundedOutcome = {
  kind: "expired",
  kill: { ok: true },
  operationElapsedMs: 10_000,
  cleanup: null,
};
const missing = () => new CommandLaunchError("cannot start: ENOENT");

const NVIDIA_SMI = [
  "GPU-2b79666e-d81f-f3f8-fd47-9903f118c3f5, NVIDIA H100 80GB HBM3, 81559, 570.86.15, 1",
  "GPU-0a1b2c3d-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 81559, 570.86.15, 0",
  "",
].join("\n");

const AMD_SMI_ROCM6 = JSON.stringify([
  {
    gpu: 0,
    asic: { market_name: "AMD Instinct MI300X", vendor_id: "0x1002" },
    bus: { bdf: "0000:0c:00.0", max_pcie_width: 16 },
    vram: { type: "HBM", vendor: "N/A", size: { value: 196592, unit: "MB" } },
    driver: { name: "amdgpu", version: "6.8.5" },
  },
  {
    gpu: 1,
    asic: { market_name: "AMD Instinct MI300X" },
    bus: { bdf: "0000:22:00.0" },
    vram: { size: { value: 196592, unit: "MB" } },
    driver: { name: "amdgpu", version: "6.8.5" },
  },
]);

describe("parseNvidiaSmiCsv", () => {
  it("parses uuid, name, memory, driver and index, sorted by index", () => {
    expect(parseNvidiaSmiCsv(NVIDIA_SMI)).toEqual([
      {
        vendor: "nvidia",
        name: "NVIDIA H100 80GB HBM3",
        vramMiB: 81559,
        id: "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        index: 0,
        driverVersion: "570.86.15",
      },
      {
        vendor: "nvidia",
        name: "NVIDIA H100 80GB HBM3",
        vramMiB: 81559,
        id: "GPU-2b79666e-d81f-f3f8-fd47-9903f118c3f5",
        index: 1,
        driverVersion: "570.86.15",
      },
    ]);
  });

  it("keeps commas in names and maps placeholders to 0 and empty", () => {
    const [gpu] = parseNvidiaSmiCsv("GPU-abc, Tesla, Rev B, [N/A], [N/A], 3\r\n");
    expect(gpu).toMatchObject({ name: "Tesla, Rev B", vramMiB: 0, driverVersion: "", index: 3 });
  });

  it("returns nothing for empty output and rejects malformed lines", () => {
    expect(parseNvidiaSmiCsv("\n")).toEqual([]);
    expect(() => parseNvidiaSmiCsv("No devices were found")).toThrow(GpuDetectionError);
    expect(() => parseNvidiaSmiCsv("GPU-a, name, 1, 2, x")).toThrow(GpuDetectionError);
  });
});

describe("parseAmdSmiStatic", () => {
  it("parses the ROCm 6 flat array", () => {
    expect(parseAmdSmiStatic(AMD_SMI_ROCM6)).toEqual([
      { index: 0, name: "AMD Instinct MI300X", vramMiB: 196592, bdf: "0000:0c:00.0", driverVersion: "6.8.5" },
      { index: 1, name: "AMD Instinct MI300X", vramMiB: 196592, bdf: "0000:22:00.0", driverVersion: "6.8.5" },
    ]);
  });

  it("parses the ROCm 7 gpu_data wrapper, string sizes and a missing driver section", () => {
    const out = JSON.stringify({
      gpu_data: [
        { gpu: 0, asic: { market_name: "MI325X" }, bus: { bdf: "0000:5F:00.0" }, vram: { size: "256 GB" } },
      ],
    });
    expect(parseAmdSmiStatic(out)).toEqual([
      { index: 0, name: "MI325X", vramMiB: 262144, bdf: "0000:5f:00.0", driverVersion: "" },
    ]);
  });

  it("rejects output it cannot read", () => {
    expect(() => parseAmdSmiStatic("not json")).toThrow(GpuDetectionError);
    expect(() => parseAmdSmiStatic("{}")).toThrow(GpuDetectionError);
    expect(() => parseAmdSmiStatic(JSON.stringify([{ gpu: 0, bus: { bdf: "../../x" } }]))).toThrow(
      GpuDetectionError,
    );
  });
});

describe("detectGpus on a host", () => {
  const expectBounded = (commands: FakeCommands) => {
    for (const call of commands.calls) expect(call.bound?.remainingMs()).toBeGreaterThan(0);
  };

  it("uses nvidia-smi when it reports GPUs, under a deadline", async () => {
    const commands = new FakeCommands(() => exited(0, NVIDIA_SMI));
    const inventory = await detectGpus(commands);
    expect(inventory.vendor).toBe("nvidia");
    expect(inventory.gpus.map((gpu) => gpu.index)).toEqual([0, 1]);
    expect(commands.argvs()).toEqual([
      "nvidia-smi --query-gpu=uuid,name,memory.total,driver_version,index --format=csv,noheader,nounits",
    ]);
    expectBounded(commands);
  });

  it("runs no tool that is not installed (none: vendor none without a command; amd-smi only: only it)", async () => {
    const none = new FakeCommands(() => exited(0, NVIDIA_SMI));
    expect(await detectGpus(none, { installed: () => Promise.resolve(false) })).toEqual({
      vendor: "none",
      gpus: [],
    });
    expect(none.calls).toHaveLength(0);
    const amdOnly = new FakeCommands(() => exited(0, "not json"));
    await detectGpus(amdOnly, {
      installed: (tool) => Promise.resolve(tool === "amd-smi"),
      log: () => undefined,
    });
    expect(amdOnly.argvs().every((argv) => argv.startsWith("amd-smi"))).toBe(true);
    expect(amdOnly.calls.length).toBeGreaterThan(0);
  });

  it("falls back to amd-smi and resolves render nodes by BDF", async () => {
    const commands = new FakeCommands((argv) =>
      argv[0] === "nvidia-smi" ? missing() : exited(0, AMD_SMI_ROCM6),
    );
    const nodes: Record<string, string> = {
      "0000:0c:00.0": "/dev/dri/renderD128",
      "0000:22:00.0": "/dev/dri/renderD136",
    };
    const inventory = await detectGpus(commands, {
      resolveRenderNode: (bdf) => Promise.resolve(nodes[bdf] ?? "/nowhere"),
    });
    expect(inventory).toEqual({
      vendor: "amd",
      gpus: [
        {
          vendor: "amd",
          name: "AMD Instinct MI300X",
          vramMiB: 196592,
          id: "/dev/dri/renderD128",
          index: 0,
          driverVersion: "6.8.5",
        },
        {
          vendor: "amd",
          name: "AMD Instinct MI300X",
          vramMiB: 196592,
          id: "/dev/dri/renderD136",
          index: 1,
          driverVersion: "6.8.5",
        },
      ],
    });
    expect(commands.argvs()[1]).toBe("amd-smi static --json --asic --vram --bus --driver");
    expectBounded(commands);
  });

  it("retries amd-smi without --driver when it exits non-zero, and skips unresolvable GPUs", async () => {
    const commands = new FakeCommands((argv) => {
      if (argv[0] === "nvidia-smi") return missing();
      return argv.includes("--driver") ? exited(2, "", "unrecognized --driver") : exited(0, AMD_SMI_ROCM6);
    });
    const logged: string[] = [];
    const inventory = await detectGpus(commands, {
      resolveRenderNode: (bdf) =>
        bdf === "0000:0c:00.0" ? Promise.resolve("/dev/dri/renderD128") : Promise.reject(new Error("ENOENT")),
      log: (msg) => logged.push(msg),
    });
    expect(inventory.gpus.map((gpu) => gpu.id)).toEqual(["/dev/dri/renderD128"]);
    expect(commands.argvs().slice(1)).toEqual([
      "amd-smi static --json --asic --vram --bus --driver",
      "amd-smi static --json --asic --vram --bus",
    ]);
    expect(logged).toHaveLength(1);
  });

  it("reports vendor none when neither tool is installed", async () => {
    const commands = new FakeCommands(() => missing());
    await expect(detectGpus(commands)).resolves.toEqual({ vendor: "none", gpus: [] });
  });

  it("reports vendor none when nvidia-smi lists no GPU and amd-smi is missing", async () => {
    const commands = new FakeCommands((argv) => (argv[0] === "nvidia-smi" ? exited(0, "") : missing()));
    await expect(detectGpus(commands)).resolves.toEqual({ vendor: "none", gpus: [] });
  });

  it("logs a failing or wedged tool and carries on without its GPUs", async () => {
    const logged: string[] = [];
    const log = (msg: string, fields?: object) => logged.push(`${msg} ${JSON.stringify(fields)}`);
    const failing = new FakeCommands((argv) =>
      argv[0] === "nvidia-smi" ? exited(9, "", "couldn't communicate with the NVIDIA driver") : missing(),
    );
    await expect(detectGpus(failing, { log })).resolves.toEqual({ vendor: "none", gpus: [] });
    expect(logged).toEqual([expect.stringMatching(/nvidia-smi failed.*NVIDIA driver/)]);

    const wedgedNvidia = new FakeCommands((argv) =>
      argv[0] === "nvidia-smi" ? expired : exited(0, AMD_SMI_ROCM6),
    );
    const amd = await detectGpus(wedgedNvidia, {
      log,
      resolveRenderNode: () => Promise.resolve("/dev/dri/renderD128"),
    });
    expect(amd.vendor).toBe("amd");

    logged.length = 0;
    const wedgedAmd = new FakeCommands((argv) => (argv[0] === "nvidia-smi" ? missing() : expired));
    await expect(detectGpus(wedgedAmd, { log })).resolves.toEqual({ vendor: "none", gpus: [] });
    expect(logged).toEqual([expect.stringMatching(/amd-smi failed.*deadline exceeded/)]);
    expect(wedgedAmd.calls).toHaveLength(2);

    const garbled = new FakeCommands(() => exited(0, "garbage"));
    await expect(detectGpus(garbled)).resolves.toEqual({ vendor: "none", gpus: [] });
  });
});

describe("detectGpus with a fixture", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "gpu-fixture-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const fixture = async (content: unknown): Promise<string> => {
    const path = join(dir, "gpus.json");
    await writeFile(path, typeof content === "string" ? content : JSON.stringify(content));
    return path;
  };
  const neverRun = new FakeCommands(() => new Error("the fixture must not run commands"));

  it("describes AMD GPUs whose nodes map to host device nodes", async () => {
    const path = await fixture({
      vendor: "amd",
      driver_version: "6.8.5",
      kfd_path: `${dir}/kfd`,
      gpus: [
        { name: "MI300X", vram_mib: 196608, render_node: `${dir}/renderD128` },
        { name: "MI300X", vram_mib: 196608, render_node: `${dir}/renderD129` },
      ],
    });
    const inventory = await detectGpus(neverRun, { fixturePath: path });
    expect(inventory).toEqual({
      vendor: "amd",
      gpus: [
        {
          vendor: "amd",
          name: "MI300X",
          vramMiB: 196608,
          id: "/dev/dri/renderD128",
          index: 0,
          driverVersion: "6.8.5",
        },
        {
          vendor: "amd",
          name: "MI300X",
          vramMiB: 196608,
          id: "/dev/dri/renderD129",
          index: 1,
          driverVersion: "6.8.5",
        },
      ],
      deviceOverrides: {
        "/dev/kfd": `${dir}/kfd`,
        "/dev/dri/renderD128": `${dir}/renderD128`,
        "/dev/dri/renderD129": `${dir}/renderD129`,
      },
    });
    expect(neverRun.calls).toHaveLength(0);
  });

  it("accepts a GPU-less fixture", async () => {
    await expect(detectGpus(neverRun, { fixturePath: await fixture({ vendor: "none" }) })).resolves.toEqual({
      vendor: "none",
      gpus: [],
    });
  });

  it.each([
    ["missing file", undefined],
    ["invalid JSON", "{"],
    ["unknown vendor", { vendor: "intel", gpus: [] }],
    ["missing kfd_path", { vendor: "amd", driver_version: "1", gpus: [] }],
    [
      "relative node",
      {
        vendor: "amd",
        driver_version: "1",
        kfd_path: "/k",
        gpus: [{ name: "g", vram_mib: 1, render_node: "r" }],
      },
    ],
    [
      "negative vram",
      {
        vendor: "amd",
        driver_version: "1",
        kfd_path: "/k",
        gpus: [{ name: "g", vram_mib: -1, render_node: "/r" }],
      },
    ],
    ["extra key", { vendor: "amd", driver_version: "1", kfd_path: "/k", gpus: [], extra: 1 }],
    [
      "shared node",
      {
        vendor: "amd",
        driver_version: "1",
        kfd_path: "/k",
        gpus: [{ name: "g", vram_mib: 1, render_node: "/k" }],
      },
    ],
  ])("rejects a fixture with %s", async (_label, content) => {
    const path = content === undefined ? join(dir, "absent.json") : await fixture(content);
    await expect(detectGpus(neverRun, { fixturePath: path })).rejects.toBeInstanceOf(GpuFixtureError);
  });
});
