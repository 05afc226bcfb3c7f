/*
 * A GPU fixture: a JSON file that stands in for the host's accelerators (`--gpu-fixture`,
 * `TASKSHIM_GPU_FIXTURE`), so every vendor's path through the shim can be tested end to end on a
 * machine without any. Device nodes the container would get are named by host paths (harmless
 * character devices in tests) and returned as `deviceOverrides`.
 */
import { readFile } from "node:fs/promises";
import Type from "typebox";
import Value from "typebox/value";
import { errorMessage } from "../errors/error-message.js";
import {
  AMD_KFD_PATH,
  GpuFixtureError,
  HUGEPAGES_1G_PATH,
  TENSTORRENT_DEVICE_DIR,
  type GpuInfo,
  type GpuInventory,
} from "./gpu-model.js";

const FIRST_RENDER_MINOR = 128;
const MAX_FIXTURE_GPUS = 64;

const HostPath = Type.String({ pattern: "^/[^\\u0000]*$", maxLength: 4096 });
const GpuName = Type.String({ minLength: 1, maxLength: 256 });
const DriverVersion = Type.String({ maxLength: 256 });
const Gpus = <T extends Type.TProperties>(properties: T) =>
  Type.Array(Type.Object(properties, { additionalProperties: false }), { maxItems: MAX_FIXTURE_GPUS });

const AmdFixtureSchema = Type.Object(
  {
    vendor: Type.Literal("amd"),
    driver_version: DriverVersion,
    kfd_path: HostPath,
    gpus: Gpus({ name: GpuName, vram_mib: Type.Integer({ minimum: 0 }), render_node: HostPath }),
  },
  { additionalProperties: false },
);
const TenstorrentFixtureSchema = Type.Object(
  {
    vendor: Type.Literal("tenstorrent"),
    driver_version: DriverVersion,
    hugepages_path: Type.Optional(HostPath),
    gpus: Gpus({ name: GpuName, vram_mib: Type.Integer({ minimum: 0 }), device_node: HostPath }),
  },
  { additionalProperties: false },
);
const IntelFixtureSchema = Type.Object(
  {
    vendor: Type.Literal("intel"),
    driver_version: DriverVersion,
    gpus: Gpus({ name: GpuName, vram_mib: Type.Integer({ minimum: 0 }) }),
  },
  { additionalProperties: false },
);
// NVIDIA GPUs reach a container through a device request, never a node: a fixture names no node.
const NvidiaFixtureSchema = Type.Object(
  {
    vendor: Type.Literal("nvidia"),
    driver_version: DriverVersion,
    gpus: Gpus({
      name: GpuName,
      vram_mib: Type.Integer({ minimum: 0 }),
      uuid: Type.String({ pattern: "^GPU-[0-9A-Za-z-]+$", maxLength: 64 }),
    }),
  },
  { additionalProperties: false },
);
const NoneFixtureSchema = Type.Object({ vendor: Type.Literal("none") }, { additionalProperties: false });

/** The vendors a fixture may name. */
const FIXTURE_VENDORS = ["nvidia", "amd", "tenstorrent", "intel", "none"] as const;

/**
 * Reads a GPU fixture. Its forms:
 *
 * ```json
 * {"vendor":"amd","driver_version":"6.8.5","kfd_path":"/tmp/x/kfd",
 *  "gpus":[{"name":"MI300X","vram_mib":196608,"render_node":"/tmp/x/renderD128"}]}
 * {"vendor":"tenstorrent","driver_version":"2.0.0","hugepages_path":"/tmp/x/hugepages-1G",
 *  "gpus":[{"name":"n300","vram_mib":24576,"device_node":"/tmp/x/tt0"}]}
 * {"vendor":"intel","driver_version":"","gpus":[{"name":"HL-225","vram_mib":98304}]}
 * {"vendor":"nvidia","driver_version":"570.86.15",
 *  "gpus":[{"name":"NVIDIA H100 80GB HBM3","vram_mib":81559,"uuid":"GPU-1d5a3f2e-8c41-4b7e-9a0d-5f6e7c8b9a01"}]}
 * {"vendor":"none"}
 * ```
 *
 * GPU `i` gets index `i` and the id its vendor uses: NVIDIA its `uuid` (distinct), AMD `/dev/dri/renderD<128+i>`, Tenstorrent
 * and Intel `"<i>"`. Host nodes are what the container sees at the standard paths, returned in
 * `deviceOverrides`: AMD's `kfd_path` at `/dev/kfd` and each `render_node` at its GPU's id;
 * Tenstorrent's `device_node` at `/dev/tenstorrent/<i>` and `hugepages_path` (optional; a
 * directory) at `/dev/hugepages-1G`. Intel has no nodes: the habana runtime adds them. Paths must
 * be absolute and distinct; unknown keys are rejected.
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
  switch (vendor) {
    case "none":
      checkFixture(path, NoneFixtureSchema, raw);
      return { vendor: "none", gpus: [] };
    case "nvidia":
      return nvidiaFixture(path, checkFixture(path, NvidiaFixtureSchema, raw));
    case "amd":
      return amdFixture(path, checkFixture(path, AmdFixtureSchema, raw));
    case "tenstorrent":
      return tenstorrentFixture(path, checkFixture(path, TenstorrentFixtureSchema, raw));
    case "intel": {
      const fixture = checkFixture(path, IntelFixtureSchema, raw);
      return { vendor: "intel", gpus: numbered("intel", fixture.gpus, fixture.driver_version) };
    }
    default:
      throw new GpuFixtureError(
        `invalid GPU fixture ${path}: vendor must be one of ${FIXTURE_VENDORS.map((v) => `"${v}"`).join(", ")}`,
      );
  }
}

/**
 * NVIDIA GPUs by UUID, as `nvidia-smi` names them: the container's device request asks for them,
 * so a container of such a fixture starts only where the NVIDIA runtime knows those UUIDs; the
 * rest of the shim (locks, instance info, DCGM) runs without one.
 */
function nvidiaFixture(path: string, fixture: Type.Static<typeof NvidiaFixtureSchema>): GpuInventory {
  const uuids = fixture.gpus.map((gpu) => gpu.uuid);
  if (new Set(uuids).size !== uuids.length) {
    throw new GpuFixtureError(`invalid GPU fixture ${path}: GPU uuids must be distinct`);
  }
  const gpus = fixture.gpus.map((gpu, index): GpuInfo => ({
    vendor: "nvidia",
    name: gpu.name,
    vramMiB: gpu.vram_mib,
    id: gpu.uuid,
    index,
    driverVersion: fixture.driver_version,
  }));
  return { vendor: "nvidia", gpus };
}

function amdFixture(path: string, fixture: Type.Static<typeof AmdFixtureSchema>): GpuInventory {
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
  checkDistinct(path, overrides, "kfd_path and render nodes");
  return { vendor: "amd", gpus, deviceOverrides: overrides };
}

function tenstorrentFixture(
  path: string,
  fixture: Type.Static<typeof TenstorrentFixtureSchema>,
): GpuInventory {
  const gpus = numbered("tenstorrent", fixture.gpus, fixture.driver_version);
  const overrides: Record<string, string> = {};
  fixture.gpus.forEach((gpu, index) => {
    overrides[`${TENSTORRENT_DEVICE_DIR}/${index}`] = gpu.device_node;
  });
  if (fixture.hugepages_path !== undefined) overrides[HUGEPAGES_1G_PATH] = fixture.hugepages_path;
  checkDistinct(path, overrides, "device nodes and hugepages_path");
  return { vendor: "tenstorrent", gpus, deviceOverrides: overrides };
}

/** GPUs whose id is their index, as Tenstorrent's and Gaudi's are. */
function numbered(
  vendor: "tenstorrent" | "intel",
  gpus: readonly { readonly name: string; readonly vram_mib: number }[],
  driverVersion: string,
): GpuInfo[] {
  return gpus.map((gpu, index) => ({
    vendor,
    name: gpu.name,
    vramMiB: gpu.vram_mib,
    id: String(index),
    index,
    driverVersion,
  }));
}

function checkDistinct(path: string, overrides: Record<string, string>, what: string): void {
  const hostNodes = Object.values(overrides);
  if (new Set(hostNodes).size !== hostNodes.length) {
    throw new GpuFixtureError(`invalid GPU fixture ${path}: ${what} must be distinct`);
  }
}

function checkFixture<T extends Type.TSchema>(path: string, schema: T, raw: unknown): Type.Static<T> {
  if (Value.Check(schema, raw)) return raw;
  const problems = [...Value.Errors(schema, raw)]
    .slice(0, 5)
    .map((e) => `${e.instancePath || "/"} ${e.message}`)
    .join("; ");
  throw new GpuFixtureError(`invalid GPU fixture ${path}: ${problems}`);
}
