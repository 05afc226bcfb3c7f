/*
 * The counters file DCGM Exporter is started with (`-f`): which DCGM fields it collects. The same
 * fields as dstack-shim's (runner/internal/shim/dcgm/exporter.go, `counters`), so a dstack server
 * charts the same series from taskshim as from dstack-shim. The format is DCGM Exporter's CSV:
 * `field name, Prometheus type, help`.
 */

/** The Prometheus type a DCGM field is exported as. */
export type CounterType = "gauge" | "counter";

/** One line of the counters file. */
export interface ExporterCounter {
  /** A DCGM field name, `DCGM_FI_…`. */
  readonly field: string;
  readonly type: CounterType;
  /** The metric's HELP text. */
  readonly help: string;
}

const gauge = (field: string, help: string): ExporterCounter => ({ field, type: "gauge", help });
const counter = (field: string, help: string): ExporterCounter => ({ field, type: "counter", help });

/** The fields collected, in the file's order. */
export const EXPORTER_COUNTERS: readonly ExporterCounter[] = [
  gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)."),
  gauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory copy utilization (%)."),
  gauge("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (%)."),
  gauge("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (%)."),
  gauge("DCGM_FI_DEV_FB_FREE", "Free framebuffer memory (MiB)."),
  gauge("DCGM_FI_DEV_FB_USED", "Used framebuffer memory (MiB)."),
  gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of cycles a graphics or compute engine is active."),
  gauge("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned."),
  gauge("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident on an SM to its maximum."),
  gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active."),
  gauge("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipes are active."),
  gauge("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipes are active."),
  gauge("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipes are active."),
  gauge("DCGM_FI_PROF_PIPE_INT_ACTIVE", "Ratio of cycles the integer pipe is active."),
  gauge("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is busy."),
  counter("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes transmitted, header and payload."),
  counter("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received, header and payload."),
  gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock (MHz)."),
  gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock (MHz)."),
  gauge("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (C)."),
  gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (C)."),
  gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (W)."),
  counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Energy consumed since boot (mJ)."),
  counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe retries."),
  gauge("DCGM_FI_DEV_XID_ERRORS", "The last XID error seen."),
  counter("DCGM_FI_DEV_POWER_VIOLATION", "Time throttled by power limits (us)."),
  counter("DCGM_FI_DEV_THERMAL_VIOLATION", "Time throttled by thermal limits (us)."),
  counter("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "Time throttled by sync boost (us)."),
  counter("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "Time throttled by board limits (us)."),
  counter("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "Time throttled by low utilization (us)."),
  counter("DCGM_FI_DEV_RELIABILITY_VIOLATION", "Time throttled by reliability limits (us)."),
  counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors."),
  counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors."),
  counter("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Single-bit persistent ECC errors."),
  counter("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Double-bit persistent ECC errors."),
  counter("DCGM_FI_DEV_RETIRED_SBE", "Pages retired for single-bit errors."),
  counter("DCGM_FI_DEV_RETIRED_DBE", "Pages retired for double-bit errors."),
  counter("DCGM_FI_DEV_RETIRED_PENDING", "Pages pending retirement."),
  counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Rows remapped for uncorrectable errors."),
  counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors."),
  gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether a row remapping failed."),
  counter("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLink flow-control CRC errors."),
  counter("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink data CRC errors."),
  counter("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink retries."),
  counter("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recovery errors."),
  counter("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "NVLink bandwidth counters of all lanes."),
  counter("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "NVLink bytes received or sent on lane 0, header and payload."),
  counter("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received, header and payload."),
  counter("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes transmitted, header and payload."),
];

/** A CSV field, quoted when it has a comma, a quote or a line break. */
function csvField(value: string): string {
  return /[",\r\n]/.test(value) ? `"${value.replace(/"/g, '""')}"` : value;
}

/** The counters file's text: one `field,type,help` line per counter. */
export function countersCsv(counters: readonly ExporterCounter[] = EXPORTER_COUNTERS): string {
  return counters.map((c) => [c.field, c.type, c.help].map(csvField).join(",")).join("\n") + "\n";
}
