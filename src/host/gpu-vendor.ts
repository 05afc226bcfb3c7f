/*
 * Which accelerator vendor a host has, from its device paths alone: no tool is run, so a host
 * without accelerators pays a few `stat` calls at startup. The order is dstack-shim's
 * (`GetGpuVendor` in runner/internal/common/gpu/gpu.go).
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import type { GpuVendor } from "./gpu-model.js";

/** One device-path test: every path must exist for the vendor to be chosen. */
interface VendorSignal {
  readonly vendor: Exclude<GpuVendor, "none">;
  readonly paths: readonly string[];
}

/**
 * The signals in the order they decide. Paths unique to a vendor come first: a host with an AMD
 * iGPU (`/dev/kfd`) and an NVIDIA card is an NVIDIA host. `/dev/kfd` and `/dev/accel` are
 * shared with devices dstack does not drive (AMD iGPUs, CPU-integrated NPUs), so they come last,
 * AMD before Gaudi: `/dev/kfd` at least names its vendor, while `/dev/accel` is the kernel's
 * vendor-neutral accelerator class, and reading it as Gaudi is a last guess.
 */
export const VENDOR_SIGNALS: readonly VendorSignal[] = [
  { vendor: "nvidia", paths: ["/dev/nvidiactl"] },
  // WSL2 exposes NVIDIA GPUs through the DirectX node, with its own nvidia-smi.
  { vendor: "nvidia", paths: ["/dev/dxg", "/usr/lib/wsl/lib/nvidia-smi"] },
  { vendor: "tenstorrent", paths: ["/dev/tenstorrent"] },
  { vendor: "amd", paths: ["/dev/kfd"] },
  { vendor: "intel", paths: ["/dev/accel"] },
];

/** Options of {@link detectGpuVendor}. */
export interface DetectVendorOptions {
  /** The file system root the paths are read under (`/`; a fake tree in tests). */
  readonly root?: string;
  /** Receives a path that exists but cannot be read (not ENOENT); it then counts as absent. */
  readonly log?: (msg: string, fields?: object) => void;
}

/**
 * The host's accelerator vendor by its device paths, `none` when no signal holds. Every path is
 * checked at once (about a millisecond in all), then the first signal in
 * {@link VENDOR_SIGNALS}' order wins.
 */
export async function detectGpuVendor(options: DetectVendorOptions = {}): Promise<GpuVendor> {
  const root = options.root ?? "/";
  const unique = [...new Set(VENDOR_SIGNALS.flatMap((signal) => signal.paths))];
  const present = new Map(
    await Promise.all(
      unique.map(async (path) => [path, await exists(join(root, path), options.log)] as const),
    ),
  );
  const found = VENDOR_SIGNALS.find((signal) => signal.paths.every((path) => present.get(path) === true));
  return found?.vendor ?? "none";
}

async function exists(path: string, log: DetectVendorOptions["log"]): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch (error) {
    // Absence is the common answer; anything else (EACCES, EIO) is worth a line, as dstack-shim logs it.
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "ENOTDIR") {
      log?.("cannot check a device path while detecting accelerators; taken as absent", {
        path,
        error: errorMessage(error),
      });
    }
    return false;
  }
}
