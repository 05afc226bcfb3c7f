/*
 * The GPU ids of the host's inventory in Docker's terms: the `HostConfig` fields a container
 * needs to use them, and the way back from an inspected container to the ids it holds. GPU
 * detection is `host/gpu-inventory.ts`; this module only imports its types.
 */
import { posix } from "node:path";
import type { AMD_KFD_PATH, GpuInventory } from "../host/gpu-inventory.js";
import type { ContainerDetails } from "./docker-client.js";

/** A GPU id that is not in the inventory was passed to {@link gpuContainerConfig}. */
export class UnknownGpuIdError extends Error {
  override readonly name = "UnknownGpuIdError";
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

/** The GPU part of a container spec (Docker `HostConfig` fields plus env). */
export interface GpuContainerConfig {
  readonly deviceRequests: readonly { Driver?: string; DeviceIDs: string[]; Capabilities: string[][] }[];
  readonly devices: readonly { PathOnHost: string; PathInContainer: string; CgroupPermissions: string }[];
  readonly capAdd: readonly string[];
  readonly securityOpt: readonly string[];
  readonly ipcMode?: string;
  readonly env: readonly string[];
}

/** Options of {@link gpuContainerConfig}. */
export interface GpuContainerConfigOptions {
  /**
   * Request NVIDIA's `display` capability (default true). No caller turns it off today:
   * dstack-shim re-creates the container without it when a start fails on
   * `/dev/nvidia-modeset`; taskshim has no such retry, so such a start fails.
   */
  readonly nvidiaDisplay?: boolean;
}

/**
 * The GPU part of the container spec for the locked `ids`: NVIDIA gets one device request
 * with the capability list; AMD gets `/dev/kfd` and each render node as devices, host IPC,
 * `SYS_PTRACE` and an unconfined seccomp profile (ROCm needs all three). Host paths go through the
 * inventory's fixture overrides. No ids → an empty config.
 *
 * @throws UnknownGpuIdError for an id the inventory does not have.
 */
export function gpuContainerConfig(
  inventory: GpuInventory,
  ids: readonly string[],
  options: GpuContainerConfigOptions = {},
): GpuContainerConfig {
  const empty: GpuContainerConfig = { deviceRequests: [], devices: [], capAdd: [], securityOpt: [], env: [] };
  if (ids.length === 0) return empty;
  const known = new Set(inventory.gpus.map((gpu) => gpu.id));
  const unknown = ids.filter((id) => !known.has(id));
  if (unknown.length > 0 || inventory.vendor === "none") {
    throw new UnknownGpuIdError(`unknown GPU id(s): ${(unknown.length > 0 ? unknown : ids).join(", ")}`);
  }
  switch (inventory.vendor) {
    case "nvidia": {
      const capabilities = NVIDIA_GPU_CAPABILITIES.filter(
        (cap) => cap !== "display" || options.nvidiaDisplay !== false,
      );
      return { ...empty, deviceRequests: [{ DeviceIDs: [...ids], Capabilities: [capabilities] }] };
    }
    case "amd": {
      const device = (path: string) => ({
        PathOnHost: inventory.deviceOverrides?.[path] ?? path,
        PathInContainer: path,
        CgroupPermissions: "rwm",
      });
      return {
        ...empty,
        devices: [device(KFD_PATH), ...ids.map(device)],
        ipcMode: "host",
        capAdd: ["SYS_PTRACE"],
        securityOpt: ["seccomp=unconfined"],
      };
    }
  }
}

/**
 * The GPU ids an existing container holds, recovered after a shim restart (by `restoreTasks`): NVIDIA
 * reads the ids of its single device request (none with explicit `gpu_devices`); AMD takes the
 * devices whose host path is one of the inventory's render nodes, mapping fixture nodes back to
 * their ids.
 */
export function gpuIdsFromContainer(
  inventory: GpuInventory,
  hostConfig: ContainerDetails["hostConfig"] | undefined,
): string[] {
  if (hostConfig === undefined) return [];
  switch (inventory.vendor) {
    case "nvidia": {
      const requests = hostConfig.DeviceRequests ?? [];
      const [only] = requests;
      if (requests.length !== 1 || only === undefined) return [];
      return (only.DeviceIDs ?? []).filter((id) => typeof id === "string" && id !== "");
    }
    case "amd": {
      const renderNodes = new Set(inventory.gpus.map((gpu) => gpu.id));
      const byHostPath = new Map(
        Object.entries(inventory.deviceOverrides ?? {}).map(([id, hostPath]) => [hostPath, id]),
      );
      const ids: string[] = [];
      for (const device of hostConfig.Devices ?? []) {
        if (device.PathOnHost === undefined) continue;
        const id = byHostPath.get(device.PathOnHost) ?? posix.normalize(device.PathOnHost);
        if (renderNodes.has(id) && !ids.includes(id)) ids.push(id);
      }
      return ids;
    }
    case "none":
      return [];
  }
}
