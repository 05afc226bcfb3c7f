/*
 * What a GPU is to the shim, whatever its vendor: the types every vendor's detection fills in, the
 * device paths the container spec names, and the errors of detection. `gpu-inventory.ts` detects;
 * `gpu-fixture.ts` reads a stand-in; one module per vendor tool parses its output.
 */

/**
 * The accelerator vendor of a host, in dstack's words (`intel` is Intel Gaudi); one vendor per
 * host, as dstack-shim assumes.
 */
export type GpuVendor = "nvidia" | "amd" | "intel" | "tenstorrent" | "none";

/** A vendor that has GPUs. */
export type AcceleratorVendor = Exclude<GpuVendor, "none">;

/** One detected GPU (an accelerator: a Gaudi card or a Tenstorrent chip counts as one). */
export interface GpuInfo {
  readonly vendor: AcceleratorVendor;
  readonly name: string;
  readonly vramMiB: number;
  /**
   * The resource id the lock hands out, per vendor as dstack-shim uses it: the NVIDIA uuid
   * (`GPU-…`), the AMD render node path (`/dev/dri/renderD128`), the Gaudi index as `hl-smi`
   * reports it (`"0"`, for `HABANA_VISIBLE_DEVICES`), the Tenstorrent device number (`"0"`, the
   * device `/dev/tenstorrent/0`).
   */
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

/** The directory of Tenstorrent's device nodes: chip `<id>` is `/dev/tenstorrent/<id>`. */
export const TENSTORRENT_DEVICE_DIR = "/dev/tenstorrent";

/**
 * The 1 GiB huge page mount Tenstorrent's runtime maps its buffers from; bound into a container
 * when the host has it (a fixture may substitute a host directory in `deviceOverrides`).
 */
export const HUGEPAGES_1G_PATH = "/dev/hugepages-1G";

/** SMI tools print these when a field is unavailable. */
export function normalizeDriverVersion(value: string): string {
  const trimmed = value.trim();
  const placeholders = ["N/A", "[N/A]", "UNKNOWN", "[UNKNOWN]", "[NOT SUPPORTED]", "[NOT AVAILABLE]"];
  return placeholders.includes(trimmed.toUpperCase()) ? "" : trimmed;
}
