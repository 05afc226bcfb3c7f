import { readdir, readFile, rm } from "node:fs/promises";
import { readBoundedFile } from "../state/bounded-read.js";
import { writeFileDurably } from "../state/durable-write.js";
import { basename, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { errorMessage } from "../errors/error-message.js";

/*
 * No exporter outlives its shim for long, and none left behind holds the port at the next start.
 *
 * Node has no PR_SET_PDEATHSIG, so two mechanisms, each covering the other's gap:
 *
 * 1. The exporter runs under a tiny `sh` wrapper (exporter-process.ts, EXPORTER_WRAPPER) whose
 *    stdin is a pipe from the shim. The shim never writes to it; when the shim dies, even by
 *    SIGKILL, the kernel closes the pipe's write end, the wrapper's `read` returns, and it
 *    SIGTERMs the exporter. That is prompt, needs no polling, and works when no shim starts again.
 * 2. The wrapper's process group id is written to `<home>/dcgm-exporter.pid`. The wrapper's own
 *    processes (its sh and its pipe watcher) can die by SIGKILL too (an OOM kill, an operator's
 *    `kill -9`) and leave the exporter behind; so the next start, before it spawns its own, kills what it finds
 *    in that group, and any process that is an exporter on this port started the way taskshim and
 *    dstack-shim start it (`dcgm-exporter … -a localhost:<port>`: dstack-shim's own exporter left by
 *    a handover is one). Nothing else is killed: a process is matched by its command line, never by
 *    a pid alone (a pid is reused), and an exporter an operator runs on another address is left.
 */

/** A record is a few dozen bytes. */
const MAX_RECORD_BYTES = 4096;

/** The pid file's name in the home. */
export const EXPORTER_PID_FILE = "dcgm-exporter.pid";

/** What the pid file records: the wrapper's process group, and how its exporter was started. */
export interface ExporterRecord {
  readonly pgid: number;
  readonly executable: string;
  readonly port: number;
}

/** A process as /proc shows it. */
export interface ProcEntry {
  readonly pid: number;
  readonly pgid: number;
  readonly argv: readonly string[];
  /** Exited, not yet reaped: nothing left to stop. */
  readonly zombie: boolean;
}

/** How the cleanup reads processes and signals them (the real /proc and kill in production). */
export interface ProcessTable {
  list(): Promise<ProcEntry[]>;
  /** Sends `signal` to one process; false when it is gone. */
  kill(pid: number, signal: NodeJS.Signals): boolean;
  /** Whether the process still runs (a zombie does not). */
  alive(pid: number): Promise<boolean>;
}

function signalled(target: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(target, signal);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ESRCH") return false;
    throw error;
  }
}

/** The host's processes, from /proc. */
export const PROC_TABLE: ProcessTable = {
  async list() {
    const entries: ProcEntry[] = [];
    for (const name of await readdir("/proc")) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const [stat, cmdline] = await Promise.all([
          readFile(`/proc/${name}/stat`, "utf8"),
          readFile(`/proc/${name}/cmdline`),
        ]);
        // The command name in parentheses may hold spaces and parentheses: fields start after the last ")".
        const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        const pgid = Number(fields[2]);
        const argv = cmdline
          .toString("utf8")
          .split("\0")
          .filter((arg) => arg !== "");
        entries.push({ pid: Number(name), pgid, argv, zombie: fields[0] === "Z" });
      } catch {
        // Gone between the listing and the read, or a kernel thread: nothing to match.
      }
    }
    return entries;
  },
  kill: (pid, signal) => signalled(pid, signal),
  alive: async (pid) => {
    try {
      const stat = await readFile(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
    } catch {
      return false;
    }
  },
};

/** The live (not zombie) processes of a process group. */
export async function liveMembers(pgid: number, table: ProcessTable = PROC_TABLE): Promise<number[]> {
  return (await table.list()).filter((p) => p.pgid === pgid && !p.zombie).map((p) => p.pid);
}

/** Whether `argv` starts DCGM Exporter (`name` directly, or a script of that name under an interpreter) on `localhost:<port>`. */
export function isExporterOnPort(argv: readonly string[], name: string, port: number): boolean {
  const runs = argv.slice(0, 2).some((arg) => basename(arg) === name);
  const at = argv.indexOf("-a");
  return runs && at >= 0 && argv[at + 1] === `localhost:${port}`;
}

/** Reads the pid file; undefined when absent or unreadable (nothing to clean). */
export async function readExporterRecord(home: string): Promise<ExporterRecord | undefined> {
  try {
    // Bounded and typed: a FIFO, a symlink to /dev/zero or a huge file there must not hold the start.
    const parsed = JSON.parse(
      await readBoundedFile(join(home, EXPORTER_PID_FILE), MAX_RECORD_BYTES),
    ) as Partial<ExporterRecord>;
    if (
      typeof parsed.pgid === "number" &&
      Number.isSafeInteger(parsed.pgid) &&
      parsed.pgid > 1 &&
      typeof parsed.executable === "string" &&
      typeof parsed.port === "number"
    ) {
      return { pgid: parsed.pgid, executable: parsed.executable, port: parsed.port };
    }
    return undefined;
  } catch {
    return undefined;
  }
}

/**
 * Records the running wrapper's group: a new file renamed over the name, so a symlink planted
 * there is replaced, never followed (a lost record only leaves the port rule).
 */
export async function writeExporterRecord(home: string, record: ExporterRecord): Promise<void> {
  await writeFileDurably(join(home, EXPORTER_PID_FILE), `${JSON.stringify(record)}\n`, 0o600);
}

/** Removes the pid file once the exporter is stopped. */
export async function removeExporterRecord(home: string): Promise<void> {
  await rm(join(home, EXPORTER_PID_FILE), { force: true });
}

/** What the cleanup did, for the log. */
export interface StaleCleanup {
  /** Processes signalled: the recorded group's matching members and exporters on the port. */
  readonly killed: readonly ProcEntry[];
  /** Whether SIGKILL was needed after the grace. */
  readonly forced: boolean;
}

/**
 * Stops every exporter an earlier shim left behind (see the top of this file): SIGTERM, then
 * SIGKILL after `graceMs` to whatever is still there. Resolves once they are gone, or after the
 * SIGKILL's short wait.
 */
export async function killStaleExporters(options: {
  readonly home: string;
  readonly executable: string;
  readonly port: number;
  readonly graceMs: number;
  readonly table?: ProcessTable;
}): Promise<StaleCleanup> {
  const table = options.table ?? PROC_TABLE;
  const name = basename(options.executable);
  const record = await readExporterRecord(options.home);
  const processes = await table.list();
  const self = process.pid;
  const matches = processes.filter((p) => {
    if (p.pid === self || p.zombie) return false;
    if (isExporterOnPort(p.argv, name, options.port)) return true;
    // The recorded wrapper's group: its sh and its exporter, as long as they still look like them.
    return (
      record !== undefined &&
      p.pgid === record.pgid &&
      (isExporterOnPort(p.argv, basename(record.executable), record.port) ||
        p.argv.includes(record.executable))
    );
  });
  for (const p of matches) table.kill(p.pid, "SIGTERM");
  let forced = false;
  const deadline = performance.now() + options.graceMs;
  const alive = async (): Promise<ProcEntry[]> => {
    const live = await Promise.all(matches.map((p) => table.alive(p.pid)));
    return matches.filter((_, i) => live[i]);
  };
  while ((await alive()).length > 0 && performance.now() < deadline) await sleep(50);
  const left = await alive();
  if (left.length > 0) {
    forced = true;
    for (const p of left) table.kill(p.pid, "SIGKILL");
    const killDeadline = performance.now() + 1_000;
    while ((await alive()).length > 0 && performance.now() < killDeadline) await sleep(20);
  }
  await removeExporterRecord(options.home).catch(() => undefined);
  return { killed: matches, forced };
}

/** One line for a cleanup that could not run (an unreadable /proc): logged, the start goes on. */
export function describeCleanupFailure(error: unknown): string {
  return `cannot look for a DCGM Exporter left by an earlier shim: ${errorMessage(error)}`;
}
