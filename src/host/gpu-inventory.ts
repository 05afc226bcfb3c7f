/*
 * GPU detection at startup: the vendor from the host's device paths (`gpu-vendor.ts`), then the
 * GPUs from that vendor's tool, as dstack-shim reads them (`GetGpuInfo` in
 * runner/internal/shim/host/gpu.go): `nvidia-smi` and `amd-smi` here, `hl-smi`
 * (`gaudi-smi.ts`) and `tt-smi` (`tenstorrent-smi.ts`) in their own modules.
 */
import { realpath } from "node:fs/promises";
import { OperationBound } from "../exec/operation-bound.js";
import { CommandFailedError, runChecked, type CommandRunner } from "../exec/run-bounded.js";
import { errorMessage } from "../errors/error-message.js";
import { detectGaudi } from "./gaudi-smi.js";
import { loadGpuFixture } from "./gpu-fixture.js";
import {
  GpuDetectionError,
  normalizeDriverVersion,
  type AcceleratorVendor,
  type GpuInfo,
  type GpuInventory,
} from "./gpu-model.js";
import { detectGpuVendor } from "./gpu-vendor.js";
import { detectTenstorrent } from "./tenstorrent-smi.js";

export {
  AMD_KFD_PATH,
  GpuDetectionError,
  GpuFixtureError,
  HUGEPAGES_1G_PATH,
  TENSTORRENT_DEVICE_DIR,
  type AcceleratorVendor,
  type GpuInfo,
  type GpuInventory,
  type GpuVendor,
} from "./gpu-model.js";
export { loadGpuFixture } from "./gpu-fixture.js";

/** Options of {@link detectGpus}. */
export interface DetectGpusOptions {
  /** Read the inventory from this JSON fixture instead of probing the host (see {@link loadGpuFixture}). */
  readonly fixturePath?: string;
  /**
   * The file system root the device paths (and Tenstorrent's driver version) are read under:
   * `/`, or a fake tree in tests.
   */
  readonly hostRoot?: string;
  /** Maps a PCI BDF to its render node; defaults to resolving `/dev/dri/by-path/pci-<bdf>-render`. */
  readonly resolveRenderNode?: (bdf: string) => Promise<string>;
  /** Receives failures of installed tools, missing tools, and GPUs that were found but skipped. */
  readonly log?: (msg: string, fields?: object) => void;
  /**
   * Whether a vendor tool is installed; one that is not is not run (the shim passes a PATH
   * lookup, `exec/on-path.ts`). Absent: the tool is run, and a launch failure means "not
   * installed".
   */
  readonly installed?: (tool: string) => Promise<boolean>;
}

/** The tool each vendor's GPUs are listed with. */
export const VENDOR_TOOLS: Readonly<Record<AcceleratorVendor, string>> = {
  nvidia: "nvidia-smi",
  amd: "amd-smi",
  intel: "hl-smi",
  tenstorrent: "tt-smi",
};

const NVIDIA_SMI_DEADLINE_MS = 10_000;
const AMD_SMI_DEADLINE_MS = 60_000;
const RENDER_NODE_PATTERN = /^\/dev\/dri\/renderD\d+$/;
const NO_GPUS: GpuInventory = { vendor: "none", gpus: [] };

/**
 * Detects the host's GPUs, once, at startup. With a fixture, reads it instead. Otherwise the
 * vendor comes from the device paths (`detectGpuVendor`: `/dev/nvidiactl` or WSL2's `/dev/dxg`,
 * `/dev/tenstorrent`, `/dev/kfd`, `/dev/accel`, in that order), and only that vendor's tool is
 * run: a host without any of those paths runs no tool at all. A tool that is not installed, fails,
 * hangs past its deadline or prints something unreadable is logged and counts as no GPUs, as in
 * dstack-shim: the shim must start anyway.
 *
 * @throws GpuFixtureError for a bad fixture (a test setup error, so it fails loudly).
 */
export async function detectGpus(
  commands: CommandRunner,
  options: DetectGpusOptions = {},
): Promise<GpuInventory> {
  if (options.fixturePath !== undefined) return loadGpuFixture(options.fixturePath);
  const { log } = options;
  const vendor = await detectGpuVendor({
    ...(options.hostRoot !== undefined ? { root: options.hostRoot } : {}),
    ...(log !== undefined ? { log } : {}),
  });
  if (vendor === "none") return NO_GPUS;
  const tool = VENDOR_TOOLS[vendor];
  if (options.installed !== undefined && !(await options.installed(tool))) {
    // The device says which vendor this is: a missing tool is a setup problem worth a line.
    log?.(`${vendor} devices found but ${tool} is not installed; assuming no GPUs`, { vendor, tool });
    return NO_GPUS;
  }
  const gpus = await probe(tool, () => listGpus(commands, vendor, options), log);
  return gpus.length > 0 ? { vendor, gpus } : NO_GPUS;
}

function listGpus(
  commands: CommandRunner,
  vendor: AcceleratorVendor,
  options: DetectGpusOptions,
): Promise<GpuInfo[]> {
  switch (vendor) {
    case "nvidia":
      return detectNvidia(commands);
    case "amd":
      return detectAmd(commands, options.resolveRenderNode ?? resolveRenderNodeByPath, options.log);
    case "intel":
      return detectGaudi(commands);
    case "tenstorrent":
      return detectTenstorrent(commands, {
        ...(options.hostRoot !== undefined ? { root: options.hostRoot } : {}),
        ...(options.log !== undefined ? { log: options.log } : {}),
      });
  }
}

async function probe(
  tool: string,
  detect: () => Promise<GpuInfo[]>,
  log: DetectGpusOptions["log"],
): Promise<GpuInfo[]> {
  try {
    return await detect();
  } catch (error) {
    // The device paths named this vendor, so even a tool that cannot be started is worth a line.
    log?.(`GPU detection with ${tool} failed; assuming no GPUs from it`, {
      error: errorMessage(error),
    });
    return [];
  }
}

async function detectNvidia(commands: CommandRunner): Promise<GpuInfo[]> {
  const stdout = await runChecked(commands, {
    argv: [
      "nvidia-smi",
      "--query-gpu=uuid,name,memory.total,driver_version,index",
      "--format=csv,noheader,nounits",
    ],
    bound: OperationBound.within(NVIDIA_SMI_DEADLINE_MS),
  });
  return parseNvidiaSmiCsv(stdout);
}

async function detectAmd(
  commands: CommandRunner,
  resolve: (bdf: string) => Promise<string>,
  log: DetectGpusOptions["log"],
): Promise<GpuInfo[]> {
  const bound = OperationBound.within(AMD_SMI_DEADLINE_MS);
  const argv = ["amd-smi", "static", "--json", "--asic", "--vram", "--bus"];
  const withDriver = await commands.run({ argv: [...argv, "--driver"], bound });
  // Older amd-smi versions reject --driver; a deadline is not retried, it would only double the wait.
  if (withDriver.kind !== "exited") throw new CommandFailedError([...argv, "--driver"], withDriver);
  const stdout =
    withDriver.code === 0 ? withDriver.stdout.toString("utf8") : await runChecked(commands, { argv, bound });
  const gpus: GpuInfo[] = [];
  for (const gpu of parseAmdSmiStatic(stdout)) {
    let renderNode: string;
    try {
      renderNode = await resolve(gpu.bdf);
    } catch (error) {
      log?.("skipping AMD GPU: cannot resolve its render node", { bdf: gpu.bdf, error: String(error) });
      continue;
    }
    if (!RENDER_NODE_PATTERN.test(renderNode)) {
      log?.("skipping AMD GPU: unexpected render node", { bdf: gpu.bdf, renderNode });
      continue;
    }
    gpus.push({
      vendor: "amd",
      name: gpu.name,
      vramMiB: gpu.vramMiB,
      id: renderNode,
      index: gpu.index,
      driverVersion: gpu.driverVersion,
    });
  }
  return gpus;
}

async function resolveRenderNodeByPath(bdf: string): Promise<string> {
  return realpath(`/dev/dri/by-path/pci-${bdf}-render`);
}

/**
 * Parses `nvidia-smi --query-gpu=uuid,name,memory.total,driver_version,index
 * --format=csv,noheader,nounits`. The name may contain commas, so it is everything between the
 * first field and the last three. An unavailable memory size becomes 0. Sorted by index.
 *
 * @throws GpuDetectionError for a line that is not five fields with a `GPU-` uuid and an index.
 */
export function parseNvidiaSmiCsv(stdout: string): GpuInfo[] {
  const gpus: GpuInfo[] = [];
  for (const line of stdout.split(/\r?\n/)) {
    if (line.trim() === "") continue;
    const raw = line.split(",");
    const fields = raw.map((field) => field.trim());
    const [uuid] = fields;
    // Stryker disable next-line StringLiteral: split() returns at least one field, so at(-1) is never undefined
    const index = fields.at(-1) ?? "";
    if (fields.length < 5 || uuid === undefined || !/^GPU-[\w-]+$/.test(uuid) || !/^\d+$/.test(index)) {
      throw new GpuDetectionError(`unexpected nvidia-smi output line: ${JSON.stringify(line)}`);
    }
    // Stryker disable next-line StringLiteral: five fields or more were checked above, so at(-3) is defined
    const vram = Number.parseInt(fields.at(-3) ?? "", 10);
    gpus.push({
      vendor: "nvidia",
      name: raw.slice(1, -3).join(",").trim(),
      // Stryker disable next-line EqualityOperator: at vram 0 both branches give 0
      vramMiB: Number.isSafeInteger(vram) && vram >= 0 ? vram : 0,
      id: uuid,
      index: Number(index),
      // Stryker disable next-line StringLiteral: five fields or more were checked above, so at(-2) is defined
      driverVersion: normalizeDriverVersion(fields.at(-2) ?? ""),
    });
  }
  return gpus.sort((a, b) => a.index - b.index);
}

/** One GPU as `amd-smi static --json` describes it, before its render node is resolved. */
export interface AmdSmiGpu {
  readonly index: number;
  readonly name: string;
  readonly vramMiB: number;
  /** PCI Domain:Bus:Device.Function, e.g. `0000:0c:00.0`. */
  readonly bdf: string;
  readonly driverVersion: string;
}

/**
 * Parses `amd-smi static --json` in both shapes: a flat array (ROCm 6) and `{"gpu_data": […]}`
 * (ROCm 7). VRAM is `{"value": N, "unit": "MB"}` or `"N MB"`; the driver section is optional.
 * Sorted by index.
 *
 * @throws GpuDetectionError when the output is not JSON of either shape, or a GPU has no BDF.
 */
export function parseAmdSmiStatic(stdout: string): AmdSmiGpu[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(stdout);
  } catch (error) {
    throw new GpuDetectionError(`amd-smi printed invalid JSON: ${errorMessage(error)}`, {
      cause: error,
    });
  }
  const entries = Array.isArray(parsed) ? parsed : isRecord(parsed) ? parsed["gpu_data"] : undefined;
  if (!Array.isArray(entries)) {
    throw new GpuDetectionError("amd-smi output is neither a GPU array nor {gpu_data: [...]}");
  }
  return entries
    .map((entry: unknown, position): AmdSmiGpu => {
      const gpu = isRecord(entry) ? entry : {};
      const bdf = field(gpu, "bus", "bdf");
      if (typeof bdf !== "string" || !/^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$/.test(bdf)) {
        throw new GpuDetectionError(`amd-smi GPU ${position} has no valid bus.bdf`);
      }
      const index = gpu["gpu"];
      const name = field(gpu, "asic", "market_name");
      const driver = field(gpu, "driver", "version") ?? field(gpu, "driver", "driver_version");
      return {
        index: typeof index === "number" && Number.isSafeInteger(index) && index >= 0 ? index : position,
        name: typeof name === "string" ? name.trim() : "",
        vramMiB: amdVramMiB(field(gpu, "vram", "size")),
        bdf: bdf.toLowerCase(),
        driverVersion: typeof driver === "string" ? normalizeDriverVersion(driver) : "",
      };
    })
    .sort((a, b) => a.index - b.index);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  // Stryker disable next-line ConditionalExpression: a JSON array has no "bus", "size" or "value" key, so read as a record it yields the same undefined fields
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function field(record: Record<string, unknown>, section: string, key: string): unknown {
  const inner = record[section];
  return isRecord(inner) ? inner[key] : undefined;
}

function amdVramMiB(size: unknown): number {
  let value: unknown = size;
  // Stryker disable next-line StringLiteral: any unit that starts with neither g nor k means a factor of 1, "" included
  let unit = "MB";
  if (isRecord(size)) {
    value = size["value"];
    if (typeof size["unit"] === "string") unit = size["unit"];
  } else if (typeof size === "string") {
    const match = /^\s*(\d+)\s*([A-Za-z]*)\s*$/.exec(size);
    value = match?.[1] === undefined ? undefined : Number(match[1]);
    if (match?.[2]) unit = match[2];
  }
  const amount = typeof value === "string" ? Number(value) : value;
  // Stryker disable next-line EqualityOperator: an amount of 0 gives 0 either way
  if (typeof amount !== "number" || !Number.isFinite(amount) || amount < 0) return 0;
  // amd-smi says MB but means MiB.
  const factor = /^g/i.test(unit) ? 1024 : /^k/i.test(unit) ? 1 / 1024 : 1;
  return Math.round(amount * factor);
}
