/*
 * Intel Gaudi accelerators (dstack's vendor `intel`) as `hl-smi` lists them, with the query
 * dstack-shim makes (`getIntelGpuInfo` in runner/internal/shim/host/gpu.go). The habana
 * container runtime takes accelerators by index only (`HABANA_VISIBLE_DEVICES=0,1`), so the
 * index is the resource id; the card's own uuid is not needed.
 */
import { OperationBound } from "../exec/operation-bound.js";
import { runChecked, type CommandRunner } from "../exec/run-bounded.js";
import { GpuDetectionError, type GpuInfo } from "./gpu-model.js";

/** The `hl-smi` call, word for word as dstack-shim makes it. */
export const HL_SMI_ARGV: readonly string[] = [
  "hl-smi",
  "--query-aip=name,memory.total,index",
  "--format=csv,noheader,nounits",
];

/** `hl-smi` opens every card; it answers in about a second on an 8-card host, so 30 s is ample. */
export const HL_SMI_DEADLINE_MS = 30_000;

/**
 * Parses `hl-smi --query-aip=name,memory.total,index --format=csv,noheader,nounits`: one line per
 * card, `HL-225, 98304, 0`. The name is everything before the last two fields; a memory size that
 * is not a number is 0 (dstack-shim logs it and keeps the card). Sorted by index. The driver
 * version is not part of dstack-shim's query and stays `""`.
 *
 * @throws GpuDetectionError for a line without three fields or without a decimal index, or two
 *   cards with one index (the lock needs distinct ids).
 */
export function parseHlSmiCsv(stdout: string): GpuInfo[] {
  const gpus: GpuInfo[] = [];
  for (const line of stdout.split(/\r?\n/)) {
    if (line.trim() === "") continue;
    const raw = line.split(",");
    const index = (raw.at(-1) ?? "").trim();
    if (raw.length < 3 || !/^\d{1,6}$/.test(index)) {
      throw new GpuDetectionError(`unexpected hl-smi output line: ${JSON.stringify(line)}`);
    }
    const memory = (raw.at(-2) ?? "").trim();
    const id = String(Number(index));
    if (gpus.some((gpu) => gpu.id === id)) {
      throw new GpuDetectionError(`hl-smi lists index ${id} twice`);
    }
    gpus.push({
      vendor: "intel",
      name: raw.slice(0, -2).join(",").trim(),
      vramMiB: /^\d+$/.test(memory) ? Number(memory) : 0,
      id,
      index: Number(index),
      driverVersion: "",
    });
  }
  return gpus.sort((a, b) => a.index - b.index);
}

/**
 * Lists the host's Gaudi cards with `hl-smi` (installed with the habanalabs driver), under
 * {@link HL_SMI_DEADLINE_MS}.
 *
 * @throws CommandFailedError or CommandLaunchError when it fails; GpuDetectionError for output it
 *   cannot read.
 */
export async function detectGaudi(commands: CommandRunner): Promise<GpuInfo[]> {
  const stdout = await runChecked(commands, {
    argv: [...HL_SMI_ARGV],
    bound: OperationBound.within(HL_SMI_DEADLINE_MS),
  });
  return parseHlSmiCsv(stdout);
}
