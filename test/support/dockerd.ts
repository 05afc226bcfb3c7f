import { spawn } from "node:child_process";
import { openSync, readdirSync, readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { testDocker } from "./docker.js";

const DOCKERD_LOG = "/var/log/taskshim-dockerd.log";

/** The running dockerd's pid and argv (read from /proc). */
export function findDockerd(): { pid: number; argv: string[] } {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").filter(Boolean);
      if (argv[0] && /(^|\/)dockerd$/.test(argv[0])) return { pid: Number(entry), argv };
    } catch {
      // the process went away
    }
  }
  throw new Error("no dockerd process found");
}

/** Whether a process with this pid exists. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Waits until the engine answers /_ping. */
export async function waitEngine(timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      await testDocker().ping();
      return;
    } catch {
      await sleep(100);
    }
  }
  throw new Error(`docker engine not back within ${timeoutMs} ms`);
}

/** Stops dockerd gracefully (SIGTERM) and waits for it to exit. Without live-restore it stops containers. */
export async function stopDockerd(timeoutMs = 60_000): Promise<string[]> {
  const { pid, argv } = findDockerd();
  process.kill(pid, "SIGTERM");
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) throw new Error("dockerd did not stop");
    await sleep(100);
  }
  return argv;
}

/** Starts dockerd detached with `argv` and waits for it to answer. */
export async function startDockerd(argv: string[]): Promise<void> {
  const log = openSync(DOCKERD_LOG, "a");
  const [program, ...args] = argv;
  // Neither this process's TMPDIR (the test project's own, scripts/test-engines.mjs, removed when
  // it exits, while containerd and runc go on writing each exec's spec there) nor its cwd.
  const env = { ...process.env };
  delete env.TMPDIR;
  const child = spawn(program ?? "dockerd", args, {
    detached: true,
    stdio: ["ignore", log, log],
    env,
    cwd: "/",
  });
  child.unref();
  await waitEngine();
}

/** dockerd's argv with or without `--live-restore`. */
export function withLiveRestore(argv: string[], on: boolean): string[] {
  const base = argv.filter((a) => a !== "--live-restore");
  return on ? [...base, "--live-restore"] : base;
}
