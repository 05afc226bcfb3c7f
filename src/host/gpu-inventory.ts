import { readFile, realpath } from "node:fs/promises";
import Type from "typebox";
import Value from "typebox/value";
import { OperationBound } from "../exec/operation-bound.js";
import {
  CommandFailedError,
  CommandLaunchError,
  runChecked,
  type CommandRunner,
} from "../exec/run-bounded.js";
import { errorMessage } from "../errors/error-message.js";

/** The GPU vendor of a host; one vendor per host, as dstack-shim assumes. */
export type GpuVendor = "nvidia" | "amd" | "none";

/** One detected GPU. */
export interface GpuInfo {
  readonly vendor: Exclude<GpuVendor, "none">;
  readonly name: string;
  readonly vramMiB: number;
  /** The resource id: the NVIDIA uuid (`GPU-…`) or the AMD render node path (`/dev/dri/renderD128`). */
  readonly id: string;
  readonly index: number;
  /** The host driver version, `""` when unknown. */
  readonly driverVersion: string;
}

/** What a host has, detected once at startup. */
export interface GpuInventory {
  readonly vendor: GpuVendor;
  readonly gpus: readonly GpuInfo[];
  /** host device nodes to substitute (fixture only): standard device path → node on the host */
  readonly deviceOverrides?: Readonly<Record<string, string>>;
}

/** Options of {@link detectGpus}. */
export interface DetectGpusOptions {
  /** Read the inventory from this JSON fixture instead of probing the host (see {@link loadGpuFixture}). */
  readonly fixturePath?: string;
  /** Maps a PCI BDF to its render node; defaults to resolving `/dev/dri/by-path/pci-<bdf>-render`. */
  readonly resolveRenderNode?: (bdf: string) => Promise<string>;
  /** Receives failures of installed tools and GPUs that were found but skipped. */
  readonly log?: (msg: string, fields?: object) => void;
  /**
   * Whether a vendor tool is installed; one that is not is not run (the shim passes a PATH
   * lookup, `exec/on-path.ts`). Absent: every tool is run, and a launch failure means "not
   * installed".
   */
  readonly installed?: (tool: string) => Promise<boolean>;
}

/** The GPU fixture file is unreadable or invalid. */
export class GpuFixtureError extends Error {
  override readonly name = "GpuFixtureError";
}

/** A vendor tool printed something we cannot read. */
export class GpuDetectionError extends Error {
  override readonly name = "GpuDetectionError";
}

/**
 * The AMD kernel driver node (ROCm needs it besides the render nodes); a fixture substitutes a host
 * node for it in `deviceOverrides`.
 */
export const AMD_KFD_PATH = "/dev/kfd";

const NVIDIA_SMI_DEADLINE_MS = 10_000;
const AMD_SMI_DEADLINE_MS = 60_000;
const RENDER_NODE_PATTERN = /^\/dev\/dri\/renderD\d+$/;
const FIRST_RENDER_MINOR = 128;
const MAX_FIXTURE_GPUS = 64;

const HostPath = Type.String({ pattern: "^/[^\\u0000]*$", maxLength: 4096 });
const AmdFixtureSchema = Type.Object(
  {
    vendor: Type.Literal("amd"),
    driver_version: Type.String({ maxLength: 256 }),
    kfd_path: HostPath,
    gpus: Type.Array(
      Type.Object(
        {
          name: Type.String({ minLength: 1, maxLength: 256 }),
          vram_mib: Type.Integer({ minimum: 0 }),
          render_node: HostPath,
        },
        { additionalProperties: false },
      ),
      { maxItems: MAX_FIXTURE_GPUS },
    ),
  },
  { additionalProperties: false },
);
const NoneFixtureSchema = Type.Object({ vendor: Type.Literal("none") }, { additionalProperties: false });

/**
 * Reads a GPU fixture: a JSON file that stands in for the host's GPUs, so the GPU path can be
 * tested end to end on a machine without any. Two forms:
 *
 * ```json
 * {"vendor":"amd","driver_version":"6.8.5","kfd_path":"/tmp/x/kfd",
 *  "gpus":[{"name":"MI300X","vram_mib":196608,"render_node":"/tmp/x/renderD128"}]}
 * {"vendor":"none"}
 * ```
 *
 * AMD GPU `i` gets the id `/dev/dri/renderD<128+i>` and index `i`. `kfd_path` and each
 * `render_node` are host device nodes (any char device, e.g. `mknod … c 1 3`) that the container
 * sees at `/dev/kfd` and at the GPU's id: they are returned in `deviceOverrides`. Paths must be
 * absolute and distinct; unknown keys are rejected.
 *
 * @throws GpuFixtureError when the file cannot be read, is not JSON, or does not match.
 */
export async function loadGpuFixture(path: string): Promise<GpuInventory> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, "utf8"));
  } catch (error) {
    throw new GpuFixtureError(`cannot read GPU fixture ${path}: ${errorMessage(error)}`, {
      cause: error,
    });
  }
  // Stryker disable next-line ConditionalExpression: read on a JSON number, string or boolean, .vendor is undefined as well
  const vendor = typeof raw === "object" && raw !== null ? (raw as { vendor?: unknown }).vendor : undefined;
  if (vendor === "none") {
    checkFixture(path, NoneFixtureSchema, raw);
    return { vendor: "none", gpus: [] };
  }
  if (vendor !== "amd") {
    throw new GpuFixtureError(`invalid GPU fixture ${path}: vendor must be "amd" or "none"`);
  }
  const fixture = checkFixture(path, AmdFixtureSchema, raw);
  const gpus = fixture.gpus.map((gpu, index): GpuInfo => ({
    vendor: "amd",
    name: gpu.name,
    vramMiB: gpu.vram_mib,
    id: `/dev/dri/renderD${FIRST_RENDER_MINOR + index}`,
    index,
    driverVersion: fixture.driver_version,
  }));
  const overrides: Record<string, string> = { [AMD_KFD_PATH]: fixture.kfd_path };
  fixture.gpus.forEach((gpu, index) => {
    const id = gpus[index]?.id;
    if (id !== undefined) overrides[id] = gpu.render_node;
  });
  const hostNodes = Object.values(overrides);
  if (new Set(hostNodes).size !== hostNodes.length) {
    throw new GpuFixtureError(`invalid GPU fixture ${path}: kfd_path and render nodes must be distinct`);
  }
  return { vendor: "amd", gpus, deviceOverrides: overrides };
}

function checkFixture<T extends Type.TSchema>(path: string, schema: T, raw: unknown): Type.Static<T> {
  if (Value.Check(schema, raw)) return raw;
  const problems = [...Value.Errors(schema, raw)]
    .slice(0, 5)
    .map((e) => `${e.instancePath || "/"} ${e.message}`)
    .join("; ");
  throw new GpuFixtureError(`invalid GPU fixture ${path}: ${problems}`);
}

/**
 * Detects the host's GPUs, once, at startup. With a fixture, reads it instead. Otherwise asks
 * `nvidia-smi`, then `amd-smi`; a tool that is not installed means "not this vendor", and a host
 * where neither finds a GPU has vendor `none`. A tool that is installed but fails, hangs past its
 * deadline or prints something unreadable is logged and counts as no GPUs, as in dstack-shim:
 * the shim must start anyway.
 *
 * @throws GpuFixtureError for a bad fixture (a test setup error, so it fails loudly).
 */
export async function detectGpus(
  commands: CommandRunner,
  options: DetectGpusOptions = {},
): Promise<GpuInventory> {
  if (options.fixturePath !== undefined) return loadGpuFixture(options.fixturePath);
  const installed = options.installed ?? (() => Promise.resolve(true));
  // Both looked up at once: on most hosts neither is installed and nothing else is needed.
  const [hasNvidia, hasAmd] = await Promise.all([installed("nvidia-smi"), installed("amd-smi")]);
  const nvidia = hasNvidia ? await probe("nvidia-smi", () => detectNvidia(commands), options.log) : [];
  if (nvidia.length > 0) return { vendor: "nvidia", gpus: nvidia };
  const resolve = options.resolveRenderNode ?? resolveRenderNodeByPath;
  const amd = hasAmd
    ? await probe("amd-smi", () => detectAmd(commands, resolve, options.log), options.log)
    : [];
  if (amd.length > 0) return { vendor: "amd", gpus: amd };
  return { vendor: "none", gpus: [] };
}

async function probe(
  tool: string,
  detect: () => Promise<GpuInfo[]>,
  log: DetectGpusOptions["log"],
): Promise<GpuInfo[]> {
  try {
    return await detect();
  } catch (error) {
    if (!(error instanceof CommandLaunchError)) {
      log?.(`GPU detection with ${tool} failed; assuming no GPUs from it`, {
        error: errorMessage(error),
      });
    }
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

/** SMI tools print these when a field is unavailable. */
function normalizeDriverVersion(value: string): string {
  const trimmed = value.trim();
  const placeholders = ["N/A", "[N/A]", "UNKNOWN", "[UNKNOWN]", "[NOT SUPPORTED]", "[NOT AVAILABLE]"];
  return placeholders.includes(trimmed.toUpperCase()) ? "" : trimmed;
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
