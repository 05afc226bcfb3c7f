/*
 * Tenstorrent accelerators as `tt-smi -s` (a JSON snapshot on stdout) describes them, read the way
 * dstack-shim reads them (`getGpusFromTtSmiSnapshot` in runner/internal/shim/host/gpu.go), so a
 * dstack server sees the same GPUs from either shim. dstack-shim runs the tool from its
 * `dstackai/tt-smi` image; taskshim runs the host's `tt-smi` when it is installed.
 *
 * One GPU is one locally attached chip, the device `/dev/tenstorrent/<n>`, numbered in the
 * snapshot's order: a chip reached through another (an n300's right chip, `n300 R`, or a remote
 * Blackhole chip, bus id `N/A`) adds its memory to the board's local chip instead.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import { OperationBound } from "../exec/operation-bound.js";
import { runChecked, type CommandRunner } from "../exec/run-bounded.js";
import { GpuDetectionError, normalizeDriverVersion, type GpuInfo } from "./gpu-model.js";

/** The `tt-smi` call: `-s` prints the snapshot to stdout (dstack-shim passes the same flag). */
export const TT_SMI_ARGV: readonly string[] = ["tt-smi", "-s"];

/** `tt-smi` resets nothing with `-s`, but wakes every chip: a 32-chip Galaxy takes tens of seconds. */
export const TT_SMI_DEADLINE_MS = 60_000;

/** The TT-KMD version file, which `tt-smi` itself reports the driver version from. */
export const TENSTORRENT_DRIVER_VERSION_PATH = "/sys/module/tenstorrent/version";

/** One chip of the snapshot, the three fields that matter. */
export interface TtSmiChip {
  /** `n150 L`, `n300 R`, `p150b`, `tt-galaxy-wh L`, `tt-galaxy-bh`… */
  readonly boardType: string;
  readonly boardId: string;
  /** The PCI address of a local chip; `N/A` for one reached through another chip. */
  readonly busId: string;
}

/**
 * The chips of a `tt-smi -s` snapshot: `device_info[].board_info`. A snapshot without
 * `device_info` has no chips (as dstack-shim reads it); a chip whose fields are missing has them
 * empty.
 *
 * @throws GpuDetectionError when the output is not a JSON object, or `device_info` is not an array.
 */
export function parseTtSmiSnapshot(stdout: string): TtSmiChip[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(stdout);
  } catch (error) {
    throw new GpuDetectionError(`tt-smi printed invalid JSON: ${errorMessage(error)}`, { cause: error });
  }
  if (!isRecord(parsed)) throw new GpuDetectionError("tt-smi output is not a JSON object");
  const devices = parsed["device_info"];
  if (devices === undefined || devices === null) return [];
  if (!Array.isArray(devices)) throw new GpuDetectionError("tt-smi device_info is not an array");
  return devices.map((device: unknown): TtSmiChip => {
    const board = isRecord(device) && isRecord(device["board_info"]) ? device["board_info"] : {};
    const text = (key: string): string => {
      const value = board[key];
      return typeof value === "string" ? value : "";
    };
    return { boardType: text("board_type"), boardId: text("board_id"), busId: text("bus_id") };
  });
}

/** A board type split into its normalised name and its side (`L`, `R`, or `""` for none). */
function boardOf(chip: TtSmiChip): { readonly name: string; readonly side: "L" | "R" | "" } {
  const type = chip.boardType.trim();
  const sided = /^(.*\S)\s+([LR])$/.exec(type);
  const base = sided?.[1] ?? type;
  const side = sided?.[2] === "L" || sided?.[2] === "R" ? sided[2] : "";
  return { name: boardName(base), side };
}

/** tt-smi's Blackhole names folded into the product names dstack knows (`p150b` → `p150`). */
function boardName(name: string): string {
  if (name === "bh-scrappy" || name === "p100") return "p100a";
  if (name.startsWith("p150")) return "p150";
  if (name.startsWith("p300")) return "p300";
  return name;
}

/** Memory of one chip in MiB; 0 for a board dstack does not know. */
function chipMemoryMiB(name: string): number {
  if (["n150", "n300", "tt-galaxy-wh"].some((prefix) => name.startsWith(prefix))) return 12 * 1024;
  if (name === "p100a") return 28 * 1024;
  if (name === "p150" || name === "p300" || name === "tt-galaxy-bh") return 32 * 1024;
  return 0;
}

function isBlackhole(name: string): boolean {
  return ["p100a", "p150", "p300", "tt-galaxy-bh"].includes(name);
}

function isRemote(chip: TtSmiChip): boolean {
  return chip.busId.trim().toUpperCase() === "N/A";
}

/**
 * The GPUs of a snapshot, numbered from 0 in the order they are found, each with its device
 * number as id. The order is dstack-shim's, in four passes: every left chip (`… L`) is a GPU; a
 * right chip (`… R`) adds its memory to the first GPU of its board (of the same name, for
 * Blackhole); a chip without side is a GPU of its own if it is a local Blackhole chip, or, for
 * older boards, adds its memory to the first GPU of its board when there is one; last, a remote
 * Blackhole chip adds its memory to the first GPU of its board and name.
 */
export function gpusFromTtSmiSnapshot(chips: readonly TtSmiChip[], driverVersion = ""): GpuInfo[] {
  const found: { boardId: string; name: string; vramMiB: number }[] = [];
  const boards = chips.map((chip) => ({ chip, ...boardOf(chip) }));
  const addTo = (boardId: string, matches: (name: string) => boolean, memory: number): boolean => {
    const gpu = found.find((entry) => entry.boardId === boardId && matches(entry.name));
    if (gpu !== undefined) gpu.vramMiB += memory;
    return gpu !== undefined;
  };
  for (const { chip, name, side } of boards) {
    if (side === "L") found.push({ boardId: chip.boardId, name, vramMiB: chipMemoryMiB(name) });
  }
  for (const { chip, name, side } of boards) {
    if (side !== "R") continue;
    addTo(chip.boardId, (other) => other === name || !isBlackhole(name), chipMemoryMiB(name));
  }
  for (const { chip, name, side } of boards) {
    if (side !== "") continue;
    if (isBlackhole(name)) {
      if (!isRemote(chip)) found.push({ boardId: chip.boardId, name, vramMiB: chipMemoryMiB(name) });
    } else if (!addTo(chip.boardId, () => true, chipMemoryMiB(name))) {
      found.push({ boardId: chip.boardId, name, vramMiB: chipMemoryMiB(name) });
    }
  }
  for (const { chip, name, side } of boards) {
    if (side === "" && isBlackhole(name) && isRemote(chip)) {
      addTo(chip.boardId, (other) => other === name, chipMemoryMiB(name));
    }
  }
  return found.map((gpu, index) => ({
    vendor: "tenstorrent",
    name: gpu.name,
    vramMiB: gpu.vramMiB,
    id: String(index),
    index,
    driverVersion,
  }));
}

/** Options of {@link detectTenstorrent}. */
export interface DetectTenstorrentOptions {
  /** The file system root the driver version is read under (`/`; a fake tree in tests). */
  readonly root?: string;
  readonly log?: (msg: string, fields?: object) => void;
}

/**
 * Lists the host's Tenstorrent chips with `tt-smi -s` under {@link TT_SMI_DEADLINE_MS}, with the
 * driver version from {@link TENSTORRENT_DRIVER_VERSION_PATH} (`""`, logged, when unreadable).
 *
 * @throws CommandFailedError or CommandLaunchError when tt-smi fails; GpuDetectionError for
 *   output it cannot read.
 */
export async function detectTenstorrent(
  commands: CommandRunner,
  options: DetectTenstorrentOptions = {},
): Promise<GpuInfo[]> {
  const stdout = await runChecked(commands, {
    argv: [...TT_SMI_ARGV],
    bound: OperationBound.within(TT_SMI_DEADLINE_MS),
  });
  const chips = parseTtSmiSnapshot(stdout);
  const versionPath = join(options.root ?? "/", TENSTORRENT_DRIVER_VERSION_PATH);
  const driverVersion = await readFile(versionPath, "utf8").then(normalizeDriverVersion, (error: unknown) => {
    options.log?.("cannot read the Tenstorrent driver version", {
      path: versionPath,
      error: errorMessage(error),
    });
    return "";
  });
  return gpusFromTtSmiSnapshot(chips, driverVersion);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
