import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { EXPIRED, exited, ScriptedCommands } from "../testing/fake-command-runner.js";
import { CommandLaunchError, type BoundedOutcome } from "../exec/run-bounded.js";
import {
  GpuDetectionError,
  GpuFixtureError,
  detectGpus,
  loadGpuFixture,
  type GpuInventory,
  parseAmdSmiStatic,
  parseNvidiaSmiCsv,
} from "./gpu-inventory.js";
import { thrown } from "../testing/thrown.js";

const missing = () => new CommandLaunchError("cannot start: ENOENT");

/** Fake host roots, one per kind of host: only the device paths detection reads exist. */
const roots: Record<"none" | "nvidia" | "amd" | "intel" | "tenstorrent", string> = {
  none: "",
  nvidia: "",
  amd: "",
  intel: "",
  tenstorrent: "",
};
const DEVICE_TREES: Record<keyof typeof roots, readonly string[]> = {
  none: ["/dev/null"],
  nvidia: ["/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"],
  amd: ["/dev/kfd", "/dev/dri/renderD128"],
  intel: ["/dev/accel/accel0"],
  tenstorrent: ["/dev/tenstorrent/0", "/sys/module/tenstorrent/version"],
};
let rootsDir: string;
beforeAll(async () => {
  rootsDir = await mkdtemp(join(tmpdir(), "gpu-hosts-"));
  for (const [kind, paths] of Object.entries(DEVICE_TREES)) {
    const root = join(rootsDir, kind);
    roots[kind as keyof typeof roots] = root;
    for (const path of paths) {
      await mkdir(dirname(join(root, path)), { recursive: true });
      await writeFile(join(root, path), path.endsWith("/version") ? "1.31\n" : "");
    }
  }
});
afterAll(async () => {
  await rm(rootsDir, { recursive: true, force: true });
});

/** `tt-smi -s` and `hl-smi` answers in their tools' shapes (test/fixtures/gpu/). */
const recorded = (name: string): string =>
  readFileSync(resolve(import.meta.dirname, "../../test/fixtures/gpu", name), "utf8");

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
  const expectBounded = (commands: ScriptedCommands) => {
    for (const call of commands.calls) expect(call.bound?.remainingMs()).toBeGreaterThan(0);
  };
  const on = (kind: keyof typeof roots, extra: Parameters<typeof detectGpus>[1] = {}) => ({
    hostRoot: roots[kind],
    ...extra,
  });

  it("runs no tool at all on a host without accelerator device paths, installed or not", async () => {
    const commands = new ScriptedCommands(() => exited(0, NVIDIA_SMI));
    const asked: string[] = [];
    const installed = (tool: string) => {
      asked.push(tool);
      return Promise.resolve(true);
    };
    await expect(detectGpus(commands, on("none", { installed }))).resolves.toEqual({
      vendor: "none",
      gpus: [],
    });
    expect(commands.calls).toHaveLength(0);
    expect(asked).toEqual([]);
  });

  it("on an NVIDIA host (an AMD iGPU beside it) uses nvidia-smi alone, under a deadline", async () => {
    const commands = new ScriptedCommands(() => exited(0, NVIDIA_SMI));
    const inventory = await detectGpus(commands, on("nvidia"));
    expect(inventory.vendor).toBe("nvidia");
    expect(inventory.gpus.map((gpu) => gpu.index)).toEqual([0, 1]);
    expect(commands.argvs()).toEqual([
      "nvidia-smi --query-gpu=uuid,name,memory.total,driver_version,index --format=csv,noheader,nounits",
    ]);
    expectBounded(commands);
  });

  it("on a Gaudi host uses hl-smi: the index is each card's id", async () => {
    const commands = new ScriptedCommands(() => exited(0, recorded("hl-smi-8x-gaudi2.csv")));
    const inventory = await detectGpus(commands, on("intel"));
    expect(inventory.vendor).toBe("intel");
    expect(inventory.gpus.map((gpu) => `${gpu.id}:${gpu.name}:${gpu.vramMiB}`)).toEqual(
      Array.from({ length: 8 }, (_, i) => `${i}:HL-225:98304`),
    );
    expect(commands.argvs()).toEqual([
      "hl-smi --query-aip=name,memory.total,index --format=csv,noheader,nounits",
    ]);
    expectBounded(commands);
  });

  it("on a Tenstorrent host uses tt-smi -s: one GPU per local chip, with the TT-KMD version", async () => {
    const commands = new ScriptedCommands(() => exited(0, recorded("tt-smi-4x-n300.json")));
    const inventory = await detectGpus(commands, on("tenstorrent"));
    expect(inventory).toEqual({
      vendor: "tenstorrent",
      gpus: [0, 1, 2, 3].map((i) => ({
        vendor: "tenstorrent",
        name: "n300",
        vramMiB: 24576,
        id: String(i),
        index: i,
        driverVersion: "1.31",
      })),
    });
    expect(commands.argvs()).toEqual(["tt-smi -s"]);
    expectBounded(commands);
  });

  it("asks only about the tool of the host's vendor, and logs it when it is missing", async () => {
    for (const [kind, tool] of [
      ["nvidia", "nvidia-smi"],
      ["amd", "amd-smi"],
      ["intel", "hl-smi"],
      ["tenstorrent", "tt-smi"],
    ] as const) {
      const asked: string[] = [];
      const logs: [string, object | undefined][] = [];
      const commands = new ScriptedCommands(() => exited(0, ""));
      const inventory = await detectGpus(
        commands,
        on(kind, {
          installed: (name) => {
            asked.push(name);
            return Promise.resolve(false);
          },
          log: (msg, fields) => logs.push([msg, fields]),
        }),
      );
      expect(inventory, kind).toEqual({ vendor: "none", gpus: [] });
      expect(asked, kind).toEqual([tool]);
      expect(commands.calls, kind).toHaveLength(0);
      expect(logs, kind).toEqual([
        [`${kind} devices found but ${tool} is not installed; assuming no GPUs`, { vendor: kind, tool }],
      ]);
    }
  });

  it("on an AMD host uses amd-smi and resolves render nodes by BDF", async () => {
    const commands = new ScriptedCommands(() => exited(0, AMD_SMI_ROCM6));
    const nodes: Record<string, string> = {
      "0000:0c:00.0": "/dev/dri/renderD128",
      "0000:22:00.0": "/dev/dri/renderD136",
    };
    const inventory = await detectGpus(
      commands,
      on("amd", { resolveRenderNode: (bdf) => Promise.resolve(nodes[bdf] ?? "/nowhere") }),
    );
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
    expect(commands.argvs()).toEqual(["amd-smi static --json --asic --vram --bus --driver"]);
    expectBounded(commands);
  });

  it("retries amd-smi without --driver when it exits non-zero, and skips unresolvable GPUs", async () => {
    const commands = new ScriptedCommands((argv) =>
      argv.includes("--driver") ? exited(2, "", "unrecognized --driver") : exited(0, AMD_SMI_ROCM6),
    );
    const logged: string[] = [];
    const inventory = await detectGpus(
      commands,
      on("amd", {
        resolveRenderNode: (bdf) =>
          bdf === "0000:0c:00.0"
            ? Promise.resolve("/dev/dri/renderD128")
            : Promise.reject(new Error("ENOENT")),
        log: (msg) => logged.push(msg),
      }),
    );
    expect(inventory.gpus.map((gpu) => gpu.id)).toEqual(["/dev/dri/renderD128"]);
    expect(commands.argvs()).toEqual([
      "amd-smi static --json --asic --vram --bus --driver",
      "amd-smi static --json --asic --vram --bus",
    ]);
    expect(logged).toHaveLength(1);
  });

  it("reports vendor none when the vendor's tool lists no GPU", async () => {
    await expect(detectGpus(new ScriptedCommands(() => exited(0, "")), on("nvidia"))).resolves.toEqual({
      vendor: "none",
      gpus: [],
    });
    await expect(
      detectGpus(new ScriptedCommands(() => exited(0, '{"device_info": []}')), on("tenstorrent")),
    ).resolves.toEqual({ vendor: "none", gpus: [] });
  });

  it("logs a failing, missing, wedged or garbling tool and carries on without GPUs", async () => {
    const logged: string[] = [];
    const log = (msg: string, fields?: object) => logged.push(`${msg} ${JSON.stringify(fields)}`);
    const failing = new ScriptedCommands(() => exited(9, "", "couldn't communicate with the NVIDIA driver"));
    await expect(detectGpus(failing, on("nvidia", { log }))).resolves.toEqual({ vendor: "none", gpus: [] });
    expect(logged).toEqual([expect.stringMatching(/nvidia-smi failed.*NVIDIA driver/)]);

    logged.length = 0;
    // The device paths said Gaudi: a tool that cannot even be started is worth a line too.
    await expect(detectGpus(new ScriptedCommands(missing), on("intel", { log }))).resolves.toEqual({
      vendor: "none",
      gpus: [],
    });
    expect(logged).toEqual([
      expect.stringMatching(/^GPU detection with hl-smi failed.*cannot start: ENOENT/),
    ]);

    logged.length = 0;
    const wedged = new ScriptedCommands(() => EXPIRED);
    await expect(detectGpus(wedged, on("tenstorrent", { log }))).resolves.toEqual({
      vendor: "none",
      gpus: [],
    });
    expect(logged).toEqual([expect.stringMatching(/tt-smi failed.*deadline exceeded/)]);

    const garbled = new ScriptedCommands(() => exited(0, "garbage"));
    for (const kind of ["nvidia", "amd", "intel", "tenstorrent"] as const) {
      await expect(detectGpus(garbled, on(kind)), kind).resolves.toEqual({ vendor: "none", gpus: [] });
    }
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
  const neverRun = new ScriptedCommands(() => new Error("the fixture must not run commands"));

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

  it("describes Tenstorrent chips whose device nodes and huge pages map to host paths", async () => {
    const path = await fixture({
      vendor: "tenstorrent",
      driver_version: "2.0.0",
      hugepages_path: `${dir}/hugepages-1G`,
      gpus: [
        { name: "n300", vram_mib: 24576, device_node: `${dir}/tt0` },
        { name: "n300", vram_mib: 24576, device_node: `${dir}/tt1` },
      ],
    });
    expect(await detectGpus(neverRun, { fixturePath: path })).toEqual({
      vendor: "tenstorrent",
      gpus: [0, 1].map((i) => ({
        vendor: "tenstorrent",
        name: "n300",
        vramMiB: 24576,
        id: String(i),
        index: i,
        driverVersion: "2.0.0",
      })),
      deviceOverrides: {
        "/dev/tenstorrent/0": `${dir}/tt0`,
        "/dev/tenstorrent/1": `${dir}/tt1`,
        "/dev/hugepages-1G": `${dir}/hugepages-1G`,
      },
    });
    const without = await fixture({ vendor: "tenstorrent", driver_version: "", gpus: [] });
    expect(await detectGpus(neverRun, { fixturePath: without })).toEqual({
      vendor: "tenstorrent",
      gpus: [],
      deviceOverrides: {},
    });
  });

  it("describes Gaudi cards by index, without device nodes (the habana runtime adds them)", async () => {
    const path = await fixture({
      vendor: "intel",
      driver_version: "1.18.0",
      gpus: [
        { name: "HL-225", vram_mib: 98304 },
        { name: "HL-225", vram_mib: 98304 },
      ],
    });
    expect(await detectGpus(neverRun, { fixturePath: path })).toEqual({
      vendor: "intel",
      gpus: [0, 1].map((i) => ({
        vendor: "intel",
        name: "HL-225",
        vramMiB: 98304,
        id: String(i),
        index: i,
        driverVersion: "1.18.0",
      })),
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
    ["unknown vendor", { vendor: "qualcomm", gpus: [] }],
    [
      "a Tenstorrent GPU without its node",
      { vendor: "tenstorrent", driver_version: "", gpus: [{ name: "n300", vram_mib: 1 }] },
    ],
    [
      "an Intel GPU with a node",
      { vendor: "intel", driver_version: "", gpus: [{ name: "HL-225", vram_mib: 1, render_node: "/r" }] },
    ],
    [
      "a relative hugepages path",
      { vendor: "tenstorrent", driver_version: "", hugepages_path: "hp", gpus: [] },
    ],
    [
      "a hugepages path shared with a node",
      {
        vendor: "tenstorrent",
        driver_version: "",
        hugepages_path: "/n",
        gpus: [{ name: "n300", vram_mib: 1, device_node: "/n" }],
      },
    ],
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

describe("GPU detection, word for word", () => {
  it("names a malformed nvidia-smi line exactly, and anchors the uuid and index patterns", () => {
    const error = thrown(() => parseNvidiaSmiCsv("No devices were found"));
    expect([error.name, error.message]).toEqual([
      "GpuDetectionError",
      'unexpected nvidia-smi output line: "No devices were found"',
    ]);
    for (const line of [
      "xGPU-abc, H100, 1, 570, 0",
      "GPU-abc!, H100, 1, 570, 0",
      "GPU-abc, H100, 1, 570, x1",
      "GPU-abc, H100, 1, 570, 1x",
      "GPU-abc, 1, 570, 0",
    ]) {
      expect(() => parseNvidiaSmiCsv(line), line).toThrow(GpuDetectionError);
    }
    expect(parseNvidiaSmiCsv("GPU-abc, H100, 1, 570, 12")[0]?.index).toBe(12);
  });

  it("skips blank lines, reads a negative memory size as 0 and trims the driver version", () => {
    expect(parseNvidiaSmiCsv("  \r\nGPU-a, H100, -5, 570.86 , 0\n\t\n")).toEqual([
      { vendor: "nvidia", name: "H100", vramMiB: 0, id: "GPU-a", index: 0, driverVersion: "570.86" },
    ]);
  });

  it("maps every placeholder a tool prints for an unknown driver version to empty, whatever its case", () => {
    for (const placeholder of [
      "N/A",
      "[N/A]",
      "UNKNOWN",
      "[UNKNOWN]",
      "[Not Supported]",
      "[NOT AVAILABLE]",
      "n/a",
    ]) {
      const out = JSON.stringify([
        { gpu: 0, bus: { bdf: "0000:0c:00.0" }, driver: { version: ` ${placeholder} ` } },
      ]);
      expect(parseAmdSmiStatic(out)[0]?.driverVersion, placeholder).toBe("");
    }
    const real = JSON.stringify([{ gpu: 0, bus: { bdf: "0000:0c:00.0" }, driver: { version: " 6.8.5 " } }]);
    expect(parseAmdSmiStatic(real)[0]?.driverVersion).toBe("6.8.5");
  });

  it("names unreadable amd-smi output exactly, with the parse error as cause", () => {
    const json = thrown(() => parseAmdSmiStatic("not json"));
    expect(json.name).toBe("GpuDetectionError");
    expect(json.message).toMatch(/^amd-smi printed invalid JSON: ./);
    expect(json.cause).toBeInstanceOf(SyntaxError);
    expect(thrown(() => parseAmdSmiStatic("{}")).message).toBe(
      "amd-smi output is neither a GPU array nor {gpu_data: [...]}",
    );
    expect(thrown(() => parseAmdSmiStatic("5")).message).toBe(
      "amd-smi output is neither a GPU array nor {gpu_data: [...]}",
    );
    const bdf = JSON.stringify([
      { gpu: 0, bus: { bdf: "0000:0c:00.0" } },
      { gpu: 1, bus: {} },
    ]);
    expect(thrown(() => parseAmdSmiStatic(bdf)).message).toBe("amd-smi GPU 1 has no valid bus.bdf");
    for (const bad of ["x0000:0c:00.0", "0000:0c:00.0x", "0000:0c:00.8", [1]]) {
      const out = JSON.stringify([{ gpu: 0, bus: { bdf: bad } }]);
      expect(() => parseAmdSmiStatic(out), JSON.stringify(bad)).toThrow(GpuDetectionError);
    }
  });

  it("reads each GPU's own index, falls back to its position for a missing or negative one, and sorts", () => {
    const out = JSON.stringify([
      { gpu: 3, bus: { bdf: "0000:01:00.0" } },
      { gpu: 0, bus: { bdf: "0000:02:00.0" } },
      { gpu: -1, bus: { bdf: "0000:03:00.0" } },
      { gpu: "7", bus: { bdf: "0000:04:00.0" } },
      { gpu: 1.5, bus: { bdf: "0000:05:00.0" } },
    ]);
    expect(parseAmdSmiStatic(out).map((gpu) => [gpu.index, gpu.bdf])).toEqual([
      [0, "0000:02:00.0"],
      [2, "0000:03:00.0"],
      [3, "0000:01:00.0"],
      [3, "0000:04:00.0"],
      [4, "0000:05:00.0"],
    ]);
  });

  it("trims the market name and reads the driver_version spelling of the driver section", () => {
    const out = JSON.stringify({
      gpu_data: [
        {
          gpu: 0,
          asic: { market_name: "  MI300X  " },
          bus: { bdf: "0000:0c:00.0" },
          driver: { name: "amdgpu", driver_version: "6.10.5" },
        },
        { gpu: 1, asic: { market_name: 7 }, bus: { bdf: "0000:0d:00.0" } },
      ],
    });
    expect(parseAmdSmiStatic(out)).toEqual([
      { index: 0, name: "MI300X", vramMiB: 0, bdf: "0000:0c:00.0", driverVersion: "6.10.5" },
      { index: 1, name: "", vramMiB: 0, bdf: "0000:0d:00.0", driverVersion: "" },
    ]);
  });

  it("reads VRAM sizes in each form and unit, and 0 for anything it cannot read", () => {
    const vram = (size: unknown): number | undefined =>
      parseAmdSmiStatic(JSON.stringify([{ gpu: 0, bus: { bdf: "0000:0c:00.0" }, vram: { size } }]))[0]
        ?.vramMiB;
    expect(vram({ value: 2048, unit: "KB" })).toBe(2);
    expect(vram({ value: 2, unit: "GB" })).toBe(2048);
    expect(vram({ value: 1024, unit: "MB" })).toBe(1024);
    expect(vram({ value: "1024", unit: "MB" })).toBe(1024);
    expect(vram({ value: true, unit: "MB" })).toBe(0);
    expect(vram({ value: -1, unit: "MB" })).toBe(0);
    expect(vram({ value: "many", unit: "MB" })).toBe(0);
    expect(vram("256GB")).toBe(262144);
    expect(vram(" 256 GB ")).toBe(262144);
    expect(vram("512")).toBe(512);
    expect(vram("x256 GB")).toBe(0);
    expect(vram("256 GB!")).toBe(0);
    expect(vram("-256 GB")).toBe(0);
    expect(vram(null)).toBe(0);
  });
});

describe("detectGpus on an AMD host, word for word", () => {
  const amdOnly = (stdoutWithDriver: BoundedOutcome) => new ScriptedCommands(() => stdoutWithDriver);
  const hostRoot = (): string => roots.amd;

  it("logs the amd-smi call with --driver that hung, and does not retry it", async () => {
    const logs: [string, object | undefined][] = [];
    const commands = amdOnly(EXPIRED);
    await detectGpus(commands, { hostRoot: hostRoot(), log: (msg, fields) => logs.push([msg, fields]) });
    expect(logs).toEqual([
      [
        "GPU detection with amd-smi failed; assuming no GPUs from it",
        { error: "amd-smi static --json --asic --vram --bus --driver: deadline exceeded after 10000 ms" },
      ],
    ]);
  });

  it("skips, and logs, a GPU whose render node cannot be resolved or is not a render node", async () => {
    const logs: [string, object | undefined][] = [];
    const nodes: Record<string, string> = {
      "0000:0c:00.0": "/x/dev/dri/renderD128",
      "0000:22:00.0": "/dev/dri/renderD136x",
    };
    const inventory = await detectGpus(amdOnly(exited(0, AMD_SMI_ROCM6)), {
      hostRoot: hostRoot(),
      resolveRenderNode: (bdf) => Promise.resolve(nodes[bdf] ?? ""),
      log: (msg, fields) => logs.push([msg, fields]),
    });
    expect(inventory).toEqual({ vendor: "none", gpus: [] });
    expect(logs).toEqual([
      [
        "skipping AMD GPU: unexpected render node",
        { bdf: "0000:0c:00.0", renderNode: "/x/dev/dri/renderD128" },
      ],
      [
        "skipping AMD GPU: unexpected render node",
        { bdf: "0000:22:00.0", renderNode: "/dev/dri/renderD136x" },
      ],
    ]);

    logs.length = 0;
    await detectGpus(amdOnly(exited(0, AMD_SMI_ROCM6)), {
      hostRoot: hostRoot(),
      resolveRenderNode: (bdf) => Promise.reject(new Error(`no node for ${bdf}`)),
      log: (msg, fields) => logs.push([msg, fields]),
    });
    expect(logs[0]).toEqual([
      "skipping AMD GPU: cannot resolve its render node",
      { bdf: "0000:0c:00.0", error: "Error: no node for 0000:0c:00.0" },
    ]);
  });

  it("resolves render nodes through /dev/dri/by-path by default", async () => {
    const logs: { bdf?: string; error?: string }[] = [];
    await detectGpus(amdOnly(exited(0, AMD_SMI_ROCM6)), {
      hostRoot: hostRoot(),
      log: (_msg, fields) => logs.push(fields ?? {}),
    });
    // This machine has no AMD GPU: the lookup fails on the by-path link it names.
    expect(logs[0]?.bdf).toBe("0000:0c:00.0");
    expect(logs[0]?.error).toContain("'/dev/dri/by-path/pci-0000:0c:00.0-render'");
  });
});

describe("GPU fixture validation, word for word", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "gpu-fixture-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const load = async (content: unknown): Promise<GpuInventory> => {
    const path = join(dir, "gpus.json");
    await writeFile(path, typeof content === "string" ? content : JSON.stringify(content));
    return loadGpuFixture(path);
  };
  const rejection = async (content: unknown): Promise<Error> => {
    const error = await load(content).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(GpuFixtureError);
    return error as Error;
  };
  const amd = (gpus: unknown[], extra: object = {}) => ({
    vendor: "amd",
    driver_version: "6.8.5",
    kfd_path: "/k",
    gpus,
    ...extra,
  });
  const node = (i: number) => ({ name: "MI300X", vram_mib: 1, render_node: `/r${i}` });

  it("names an unreadable file, with its cause", async () => {
    const path = join(dir, "absent.json");
    const error = await loadGpuFixture(path).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(error?.name).toBe("GpuFixtureError");
    expect(error?.message).toMatch(new RegExp(`^cannot read GPU fixture ${path}: ENOENT`));
    expect(error?.cause).toMatchObject({ code: "ENOENT" });
  });

  it("names a missing or unknown vendor, whatever the JSON value", async () => {
    const path = join(dir, "gpus.json");
    for (const content of ["null", "5", '"amd"', '{"vendor":"habana"}', "[]"]) {
      expect((await rejection(content)).message, content).toBe(
        `invalid GPU fixture ${path}: vendor must be one of "nvidia", "amd", "tenstorrent", "intel", "none"`,
      );
    }
  });

  it("names shared host nodes", async () => {
    expect((await rejection(amd([node(1), node(1)]))).message).toBe(
      `invalid GPU fixture ${join(dir, "gpus.json")}: kfd_path and render nodes must be distinct`,
    );
    const tenstorrent = {
      vendor: "tenstorrent",
      driver_version: "",
      gpus: [
        { name: "n150", vram_mib: 1, device_node: "/n" },
        { name: "n150", vram_mib: 1, device_node: "/n" },
      ],
    };
    expect((await rejection(tenstorrent)).message).toBe(
      `invalid GPU fixture ${join(dir, "gpus.json")}: device nodes and hugepages_path must be distinct`,
    );
  });

  it("lists at most five schema problems with their JSON paths", async () => {
    const prefix = `invalid GPU fixture ${join(dir, "gpus.json")}: `;
    const many = await rejection(
      amd([{ name: "" }, { name: "", vram_mib: -1 }], { kfd_path: 1, x: 1, y: 2 }),
    );
    expect(many.message.startsWith(prefix)).toBe(true);
    expect(many.message.slice(prefix.length).split("; ")).toHaveLength(5);
    // A problem at the root is named "/", one inside by its JSON path.
    expect((await rejection({ vendor: "none", gpus: [] })).message).toBe(
      `${prefix}/gpus schema is false; / must not have additional properties`,
    );
  });

  it("holds each GPU and the vendor none form to the schema's limits", async () => {
    await expect(load(amd(Array.from({ length: 64 }, (_, i) => node(i))))).resolves.toMatchObject({
      vendor: "amd",
    });
    await rejection(amd(Array.from({ length: 65 }, (_, i) => node(i))));
    await rejection(amd([{ ...node(0), name: "" }]));
    await rejection(amd([{ ...node(0), name: "x".repeat(257) }]));
    await expect(load(amd([{ ...node(0), name: "x".repeat(256) }]))).resolves.toMatchObject({
      vendor: "amd",
    });
    await rejection(amd([{ ...node(0), extra: 1 }]));
    await rejection(amd([node(0)], { driver_version: "x".repeat(257) }));
    await rejection({ vendor: "none", gpus: [] });
  });
});
