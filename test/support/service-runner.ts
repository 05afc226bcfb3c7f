import { spawn, type ChildProcess } from "node:child_process";
import { readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";

/*
 * A small stand-in for systemd, for the machines the tests run on (no systemd there): it runs one
 * unit as systemd would for the keys dstack's SSH-fleet unit uses — ExecStart (argv split on
 * spaces, no quoting: dstack's has none), WorkingDirectory, EnvironmentFile (re-read at every
 * start), Restart=always with RestartSec, and `systemctl restart` / `stop` (SIGTERM to the main
 * process, SIGKILL after TimeoutStopSec's default 90 s). Nothing else of systemd is imitated.
 */

/** The `[Service]` keys of a unit that this runner honours. */
export interface ServiceUnit {
  readonly execStart: readonly string[];
  readonly workingDirectory?: string;
  readonly environmentFile?: string;
  readonly restartAlways: boolean;
  readonly restartSecMs: number;
}

/** Reads the `[Service]` section of a unit file. */
export function parseUnit(text: string): ServiceUnit {
  const service = new Map<string, string>();
  let section = "";
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    const header = /^\[(.+)\]$/.exec(line);
    if (header) section = header[1] ?? "";
    else if (section === "Service" && line.includes("=")) {
      service.set(line.slice(0, line.indexOf("=")).trim(), line.slice(line.indexOf("=") + 1).trim());
    }
  }
  const execStart = (service.get("ExecStart") ?? "").split(/\s+/).filter(Boolean);
  if (execStart.length === 0) throw new Error("the unit has no ExecStart");
  const workingDirectory = service.get("WorkingDirectory");
  const environmentFile = service.get("EnvironmentFile");
  return {
    execStart,
    ...(workingDirectory ? { workingDirectory } : {}),
    ...(environmentFile ? { environmentFile } : {}),
    restartAlways: service.get("Restart") === "always",
    restartSecMs: Number(service.get("RestartSec") ?? "0.1") * 1000,
  };
}

/** An EnvironmentFile as systemd reads it: `KEY=value` lines, one pair of quotes stripped. */
export function parseEnvironmentFile(text: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || !line.includes("=")) continue;
    const key = line.slice(0, line.indexOf("=")).trim();
    let value = line.slice(line.indexOf("=") + 1).trim();
    if (/^".*"$/.test(value) || /^'.*'$/.test(value)) value = value.slice(1, -1);
    env[key] = value;
  }
  return env;
}

const STOP_TIMEOUT_MS = 90_000;

/** One unit, run as systemd runs it (see the file's comment). */
export class ServiceRunner {
  private child: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();
  private active = false;
  private restartTimer: NodeJS.Timeout | undefined;
  /** Every start of the main process, and how each run ended. */
  readonly runs: { pid: number | undefined; exit?: number | string }[] = [];
  /** stdout and stderr of every run, for a failing test's message. */
  output = "";

  /**
   * @param unitPath the unit file, read again at every `restart()` (`daemon-reload` is implied)
   * @param baseEnv what the manager's own environment gives every service (PATH, HOME for User=root)
   */
  constructor(
    private readonly unitPath: string,
    private readonly baseEnv: NodeJS.ProcessEnv,
  ) {}

  /** `systemctl restart`: stop the running main process (if any), then start at once. */
  async restart(): Promise<void> {
    await this.stop();
    this.active = true;
    await this.spawnOnce();
  }

  /** `systemctl stop`: SIGTERM, SIGKILL after 90 s; no restart follows. */
  async stop(): Promise<void> {
    this.active = false;
    clearTimeout(this.restartTimer);
    const child = this.child;
    if (child?.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
      await this.exited;
      clearTimeout(killer);
    }
  }

  /** The pid of the running main process, if one runs. */
  get pid(): number | undefined {
    const child = this.child;
    return child?.exitCode === null && child.signalCode === null ? child.pid : undefined;
  }

  private async spawnOnce(): Promise<void> {
    const unit = parseUnit(await readFile(this.unitPath, "utf8"));
    const fileEnv = unit.environmentFile
      ? parseEnvironmentFile(await readFile(unit.environmentFile, "utf8"))
      : {};
    const [command = "", ...args] = unit.execStart;
    const child = spawn(command, args, {
      cwd: unit.workingDirectory ?? "/",
      env: { ...this.baseEnv, ...fileEnv },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const run: (typeof this.runs)[number] = { pid: child.pid };
    this.runs.push(run);
    this.child = child;
    child.stdout.on("data", (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (this.output += chunk.toString()));
    this.exited = new Promise((resolve) =>
      child.once("exit", (code, signal) => {
        run.exit = code ?? signal ?? "unknown";
        if (this.active && unit.restartAlways) {
          this.restartTimer = setTimeout(() => void this.spawnOnce(), unit.restartSecMs);
        }
        resolve();
      }),
    );
    child.once("error", (error) => (this.output += `spawn failed: ${error.message}\n`));
  }
}

/** Polls `read` every `everyMs` until it resolves, as dstack's server polls host_info.json. */
export async function pollUntil<T>(read: () => Promise<T>, timeoutMs: number, everyMs = 100): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    try {
      return await read();
    } catch (error) {
      if (performance.now() > deadline) throw error;
    }
    await sleep(everyMs);
  }
}
