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
