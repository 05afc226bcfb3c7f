import { execFileSync } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";

let clockTicks: number | undefined;

/** The kernel's clock ticks per second (`getconf CLK_TCK`), the unit of /proc/<pid>/stat times. */
export function clockTicksPerSecond(): number {
  if (clockTicks === undefined) {
    try {
      clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
    } catch {
      clockTicks = 100;
    }
  }
  return clockTicks;
}

/** CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat. */
export async function cpuSeconds(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8");
  // The command name (field 2) may contain spaces and parentheses: fields start after the last ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime and stime are fields 14 and 15 of the whole line, i.e. 11 and 12 after the name.
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) throw new Error(`cannot parse /proc/${pid}/stat`);
  return (utime + stime) / clockTicksPerSecond();
}

/** A `kB` (KiB) field of /proc/<pid>/status (VmRSS, VmHWM…), in MB (10^6 bytes). */
export async function statusMB(pid: number, field: "VmRSS" | "VmHWM"): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const match = new RegExp(`^${field}:\\s+(\\d+)\\s+kB$`, "m").exec(status);
  if (!match?.[1]) throw new Error(`no ${field} in /proc/${pid}/status`);
  return (Number(match[1]) * 1024) / 1e6;
}

/** Where a process's resident memory lies, MB, by kind of mapping (/proc/<pid>/smaps). */
export interface ResidentBreakdown {
  /** Every mapping's resident pages (what VmRSS counts), from the same read as the parts. */
  readonly total: number;
  /** Pages of files: the node binary, libraries. */
  readonly file: number;
  /** glibc's main arena (the `[heap]` of brk). */
  readonly brk: number;
  /** glibc's thread arenas: anonymous read-write mappings at 64 MiB-aligned addresses. */
  readonly arenas: number;
  readonly arenaCount: number;
  /** Executable anonymous mappings: V8's JIT code. */
  readonly code: number;
  /** Every other anonymous mapping (V8's heap pages, thread stacks, buffers). */
  readonly otherAnon: number;
}

/** glibc's HEAP_MAX_SIZE on 64-bit: each thread arena's heap is aligned to it. */
const ARENA_ALIGN = 64n * 1024n * 1024n;

/**
 * The resident set split by kind of mapping, to tell growth of the C heap, of JIT code and of
 * the binary's touched pages apart (what V8's own heap figures do not show).
 */
export async function residentBreakdown(pid: number): Promise<ResidentBreakdown> {
  const kb = { file: 0, brk: 0, arenas: 0, code: 0, otherAnon: 0 };
  let arenaCount = 0;
  let kind: keyof typeof kb = "otherAnon";
  for (const line of (await readFile(`/proc/${pid}/smaps`, "utf8")).split("\n")) {
    const mapping = /^([0-9a-f]+)-[0-9a-f]+ (\S+) \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (mapping) {
      const [, start = "0", perms = "", path = ""] = mapping;
      const arena = perms === "rw-p" && path === "" && BigInt(`0x${start}`) % ARENA_ALIGN === 0n;
      if (arena) arenaCount++;
      kind =
        path === "[heap]"
          ? "brk"
          : path !== "" && !path.startsWith("[")
            ? "file"
            : arena
              ? "arenas"
              : perms.includes("x")
                ? "code"
                : "otherAnon";
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB$/.exec(line);
    if (rss) kb[kind] += Number(rss[1]);
  }
  const mb = (n: number): number => Math.round((n * 1024) / 1e5) / 10;
  return {
    total: mb(kb.file + kb.brk + kb.arenas + kb.code + kb.otherAnon),
    file: mb(kb.file),
    brk: mb(kb.brk),
    arenas: mb(kb.arenas),
    arenaCount,
    code: mb(kb.code),
    otherAnon: mb(kb.otherAnon),
  };
}

/** The pid of the local dockerd (found in /proc), or undefined (remote engine, or none). */
export async function dockerdPid(): Promise<number | undefined> {
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const argv0 = await readFile(`/proc/${entry}/cmdline`, "utf8")
      .then((c) => c.split("\0")[0] ?? "")
      .catch(() => "");
    if (/(^|\/)dockerd$/.test(argv0)) return Number(entry);
  }
  return undefined;
}
