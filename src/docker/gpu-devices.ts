/*
 * The GPU ids of the host's inventory in Docker's terms: the `HostConfig` fields a container
 * needs to use them, and the way back from an inspected container to the ids it holds. GPU
 * detection is `host/gpu-inventory.ts`; this module only imports its types. The spec is built
 * for Docker; `gpuRequestsForEngine` is the one translation of its GPUs for Podman (CDI).
 */
import { existsSync } from "node:fs";
import { posix } from "node:path";
import type {
  AMD_KFD_PATH,
  GpuInventory,
  HUGEPAGES_1G_PATH,
  TENSTORRENT_DEVICE_DIR,
} from "../host/gpu-inventory.js";
import type { ContainerDetails, ContainerSpec, DeviceMapping, GpuRequest } from "./docker-client.js";
import { versionAtLeast, type EngineInfo } from "./engine-info.js";

/** A GPU id that is not in the inventory was passed to {@link gpuContainerConfig}. */
export class UnknownGpuIdError extends Error {
  override readonly name = "UnknownGpuIdError";
}

/** The engine cannot give a container the GPUs its spec asks for; the message says why. */
export class EngineGpuUnsupportedError extends Error {
  override readonly name = "EngineGpuUnsupportedError";
}

/** The CDI kind of NVIDIA GPUs in the spec `nvidia-ctk cdi generate` writes. */
export const NVIDIA_CDI_KIND = "nvidia.com/gpu";

/**
 * The first Podman whose Docker-compatible API passes CDI devices: from 5.5.0 it turns a device
 * request with driver `cdi` into CDI devices. Earlier ones (4.3.1 here) drop every device request
 * without a word and read a `HostConfig.Devices` entry as a device node path.
 */
export const PODMAN_CDI_REQUESTS_SINCE: readonly [number, number, number] = [5, 5, 0];

/** An NVIDIA GPU id (its UUID) as a CDI device name: `nvidia.com/gpu=GPU-…`. */
export function nvidiaCdiName(id: string): string {
  return `${NVIDIA_CDI_KIND}=${id}`;
}

/** Capabilities of the NVIDIA device request (dstack-shim's list). */
export const NVIDIA_GPU_CAPABILITIES: readonly string[] = [
  "gpu",
  "utility",
  "compute",
  "graphics",
  "video",
  "display",
  "compat32",
];

/** ROCm's device node, the same path on the host and in the container; typed to match the host's. */
const KFD_PATH: typeof AMD_KFD_PATH = "/dev/kfd";
/** Tenstorrent's device directory and 1 GiB huge page mount; typed to match the host's. */
const TT_DEVICE_DIR: typeof TENSTORRENT_DEVICE_DIR = "/dev/tenstorrent";
const HUGEPAGES_PATH: typeof HUGEPAGES_1G_PATH = "/dev/hugepages-1G";

/** The container runtime of Intel Gaudi (habana-container-runtime), registered with the engine. */
export const HABANA_RUNTIME = "habana";
/** The variable the habana runtime reads the accelerator indices from. */
export const HABANA_VISIBLE_DEVICES = "HABANA_VISIBLE_DEVICES";

/** The GPU part of a container spec: `ContainerSpec`'s fields of the same names, its GPU requests and env. */
export type GpuContainerConfig = Pick<
  ContainerSpec,
  "devices" | "mounts" | "capAdd" | "securityOpt" | "ipcMode" | "runtime"
> & {
  readonly deviceRequests: readonly GpuRequest[];
  readonly env: readonly string[];
};

export interface GpuContainerConfigOptions {
  /**
   * Request NVIDIA's `display` capability (default true). A start that fails because the host has
   * no `/dev/nvidia-modeset` is made again without it (`runner/nvidia-display-retry.ts`).
   */
  readonly nvidiaDisplay?: boolean;
  /**
   * Whether a host path exists, asked for Tenstorrent's huge page mount when the spec is built
   * (a mount that appears after the shim started is used). Defaults to `existsSync`.
   */
  readonly hostPathExists?: (path: string) => boolean;
}

/**
 * The GPU part of the container spec for the locked `ids`, per vendor as dstack-shim's
 * `configureGpus` (runner/internal/shim/docker.go) sets it:
 *
 * - NVIDIA: one device request with the ids and the capability list;
 * - AMD: `/dev/kfd` and each render node as devices, host IPC, `SYS_PTRACE` and an unconfined
 *   seccomp profile (ROCm needs all three);
 * - Tenstorrent: each `/dev/tenstorrent/<id>` as a device, and `/dev/hugepages-1G` bind-mounted
 *   when the host has it;
 * - Intel Gaudi: the `habana` runtime, host IPC, `SYS_NICE` and `HABANA_VISIBLE_DEVICES=<ids>`
 *   (the runtime adds the device nodes itself).
 *
 * Host paths go through the inventory's fixture overrides. No ids → an empty config.
 *
 * @throws UnknownGpuIdError for an id the inventory does not have.
 */
export function gpuContainerConfig(
  inventory: GpuInventory,
  ids: readonly string[],
  options: GpuContainerConfigOptions = {},
): GpuContainerConfig {
  const empty: GpuContainerConfig = {
    deviceRequests: [],
    devices: [],
    mounts: [],
    capAdd: [],
    securityOpt: [],
    env: [],
  };
  if (ids.length === 0) return empty;
  const known = new Set(inventory.gpus.map((gpu) => gpu.id));
  const unknown = ids.filter((id) => !known.has(id));
  if (unknown.length > 0 || inventory.vendor === "none") {
    throw new UnknownGpuIdError(`unknown GPU id(s): ${(unknown.length > 0 ? unknown : ids).join(", ")}`);
  }
  const hostPath = (path: string): string => inventory.deviceOverrides?.[path] ?? path;
  const device = (path: string): DeviceMapping => ({
    pathOnHost: hostPath(path),
    pathInContainer: path,
    cgroupPermissions: "rwm",
  });
  switch (inventory.vendor) {
    case "nvidia": {
      const capabilities = NVIDIA_GPU_CAPABILITIES.filter(
        (cap) => cap !== "display" || options.nvidiaDisplay !== false,
      );
      return { ...empty, deviceRequests: [{ deviceIds: [...ids], capabilities: [capabilities] }] };
    }
    case "amd":
      return {
        ...empty,
        devices: [device(KFD_PATH), ...ids.map(device)],
        ipcMode: "host",
        capAdd: ["SYS_PTRACE"],
        securityOpt: ["seccomp=unconfined"],
      };
    case "tenstorrent": {
      const exists = options.hostPathExists ?? existsSync;
      const hugepages = hostPath(HUGEPAGES_PATH);
      return {
        ...empty,
        devices: ids.map((id) => device(`${TT_DEVICE_DIR}/${id}`)),
        mounts: exists(hugepages) ? [{ source: hugepages, target: HUGEPAGES_PATH }] : [],
      };
    }
    case "intel":
      return {
        ...empty,
        runtime: HABANA_RUNTIME,
        ipcMode: "host",
        capAdd: ["SYS_NICE"],
        env: [`${HABANA_VISIBLE_DEVICES}=${ids.join(",")}`],
      };
  }
}

/** A spec's GPU requests as the engine takes them, with the CDI devices they name. */
export interface EngineGpuRequests {
  readonly gpuRequests: readonly GpuRequest[];
  /** The CDI names of the container's GPUs (Podman only): the engine does not report them back. */
  readonly cdiDevices: readonly string[];
}

/**
 * A spec's GPU requests for `engine`. Docker takes them as built. Podman gets NVIDIA's request as
 * one CDI request (driver `cdi`, ids `nvidia.com/gpu=<uuid>`, no capabilities): the host needs
 * the CDI spec of nvidia-container-toolkit, with UUID names. AMD's device nodes (`/dev/kfd`,
 * `/dev/dri/renderD*`) are plain devices on both engines and are no requests at all.
 *
 * @throws EngineGpuUnsupportedError on a Podman before {@link PODMAN_CDI_REQUESTS_SINCE} (it would
 *   start the container without its GPUs), or for a request that names no device ids.
 */
export function gpuRequestsForEngine(
  gpuRequests: readonly GpuRequest[],
  engine: EngineInfo,
): EngineGpuRequests {
  if (engine.kind !== "podman" || gpuRequests.length === 0) return { gpuRequests, cdiDevices: [] };
  const cdiDevices: string[] = [];
  for (const request of gpuRequests) {
    const ids = request.deviceIds.filter((id) => id !== "");
    if (ids.length === 0) {
      throw new EngineGpuUnsupportedError(
        "Podman takes GPUs only by name (CDI); a device request without device ids has none",
      );
    }
    // The spec's own requests are NVIDIA's (no driver); one already for CDI keeps its names.
    cdiDevices.push(...(request.driver === "cdi" ? ids : ids.map(nvidiaCdiName)));
  }
  if (!versionAtLeast(engine.version, PODMAN_CDI_REQUESTS_SINCE)) {
    throw new EngineGpuUnsupportedError(
      `Podman ${engine.version} cannot give a container GPUs through its Docker-compatible API ` +
        `(it drops device requests; CDI device requests are passed from Podman ${PODMAN_CDI_REQUESTS_SINCE.join(".")})`,
    );
  }
  return { gpuRequests: [{ driver: "cdi", deviceIds: cdiDevices, capabilities: [] }], cdiDevices };
}

/** A device id as the inventory names the GPU: a CDI name of NVIDIA's kind loses its prefix. */
function gpuIdOfDeviceId(id: string): string {
  const prefix = `${NVIDIA_CDI_KIND}=`;
  return id.startsWith(prefix) ? id.slice(prefix.length) : id;
}

/**
 * The GPU ids an existing container holds, recovered after a shim restart (by `restoreTasks`), per
 * vendor as dstack-shim's `restoreStateFromContainers` reads them back:
 *
 * - NVIDIA: the ids of its single device request (none with explicit `gpu_devices`), a CDI
 *   request's `nvidia.com/gpu=<uuid>` names as their UUIDs (on Podman the adapter restores that
 *   request from the container's label, as Podman does not report it);
 * - AMD: the devices whose host path is one of the inventory's render nodes;
 * - Tenstorrent: the `<id>` of each device `/dev/tenstorrent/<id>`;
 * - Intel Gaudi: the indices of `HABANA_VISIBLE_DEVICES` in the container's `env`.
 *
 * Fixture nodes are mapped back to their ids, and only ids the inventory has are returned, each
 * once, in the container's order.
 */
export function gpuIdsFromContainer(
  inventory: GpuInventory,
  hostConfig: ContainerDetails["hostConfig"] | undefined,
  env: readonly string[] = [],
): string[] {
  if (hostConfig === undefined) return [];
  const known = new Set(inventory.gpus.map((gpu) => gpu.id));
  const byHostPath = new Map(
    Object.entries(inventory.deviceOverrides ?? {}).map(([path, hostPath]) => [hostPath, path]),
  );
  const devicePaths = (): string[] =>
    (hostConfig.Devices ?? []).flatMap((device) =>
      device.PathOnHost === undefined
        ? []
        : [byHostPath.get(device.PathOnHost) ?? posix.normalize(device.PathOnHost)],
    );
  const knownOnce = (ids: readonly string[]): string[] =>
    ids.filter((id, at) => known.has(id) && ids.indexOf(id) === at);
  switch (inventory.vendor) {
    case "nvidia": {
      const requests = hostConfig.DeviceRequests ?? [];
      const [only] = requests;
      if (requests.length !== 1 || only === undefined) return [];
      return (only.DeviceIDs ?? [])
        .filter((id) => typeof id === "string")
        .map(gpuIdOfDeviceId)
        .filter((id) => id !== "");
    }
    case "amd":
      return knownOnce(devicePaths());
    case "tenstorrent": {
      const prefix = `${TT_DEVICE_DIR}/`;
      return knownOnce(
        devicePaths()
          .filter((path) => path.startsWith(prefix))
          .map((path) => path.slice(prefix.length)),
      );
    }
    case "intel": {
      const prefix = `${HABANA_VISIBLE_DEVICES}=`;
      const visible = env.find((entry) => entry.startsWith(prefix));
      return visible === undefined ? [] : knownOnce(visible.slice(prefix.length).split(","));
    }
    case "none":
      return [];
  }
}
