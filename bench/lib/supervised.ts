import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFile, mkdir, readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import type { Bench } from "./harness.js";
import { logTimes } from "./log-times.js";

const execFileAsync = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "../..");

/** A single binary built for a rollout: where it is, its sha256 and the version it reports. */
export interface RolloutBinary {
  readonly path: string;
  readonly sha256: string;
  readonly version: string;
}

/**
 * Builds the single binaries A (1.0.0) and B (1.1.0) the way `npm run build:binary` does
 * (scripts/build-binary.mjs, from the pinned Node.js), in a temp dir of the run. B8 and B9 roll
 * them out A → B → A.
 */
export async function buildRolloutBinaries(bench: Bench): Promise<{ A: RolloutBinary; B: RolloutBinary }> {
  const dir = await bench.tempDir("taskshim-bench-bin-");
  const build = async (name: string, version: string): Promise<RolloutBinary> => {
    const path = join(dir, `taskshim-${name}`);
    await execFileAsync(
      process.execPath,
      [join(ROOT, "scripts/build-binary.mjs"), "--outfile", path, "--version", version],
      { cwd: ROOT },
    );
    const sha256 = createHash("sha256")
      .update(await readFile(path))
      .digest("hex");
    return { path, sha256, version };
  };
  return { A: await build("A", "1.0.0"), B: await build("B", "1.1.0") };
}

/**
 * `taskshim supervise` of binary A holding the API socket, its shim on `home` and `port`, the
 * installed binary (what an upgrade replaces) in `<dir>/bin/taskshim`. Logs of the supervisor
 * and of every shim it starts are collected in `logs`.
 */
export class SupervisedShim {
  logs = "";
  readonly url: string;

  private constructor(
    readonly child: ChildProcess,
    readonly home: string,
    readonly port: number,
  ) {
    this.url = `http://127.0.0.1:${port}`;
    const collect = (chunk: Buffer): void => {
      this.logs += chunk.toString();
    };
    child.stdout?.on("data", collect);
    child.stderr?.on("data", collect);
  }

  /** Starts the supervisor (binary `a`) and waits until the shim answers its healthcheck. */
  static async start(
    bench: Bench,
    a: RolloutBinary,
    home: string,
    port: number,
    readyTimeoutMs = 120_000,
  ): Promise<SupervisedShim> {
    const bin = join(await bench.tempDir("taskshim-bench-installed-"), "bin");
    await mkdir(bin);
    const installed = join(bin, "taskshim");
    await copyFile(a.path, installed);
    const child = spawn(
      a.path,
      [
        "supervise",
        "--binary",
        installed,
        "--",
        "--shim-home",
        home,
        "--shim-http-port",
        String(port),
        "--shim-binary-path",
        installed,
      ],
      {
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, DSTACK_SHIM_LOG_LEVEL: "info" },
        // Its own process group, so that the cleanup can end the supervisors and the shim at once.
        detached: true,
      },
    );
    const shim = new SupervisedShim(child, home, port);
    bench.track(child);
    const deadline = performance.now() + readyTimeoutMs;
    while (performance.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`supervisor exited:\n${shim.logs.slice(-4000)}`);
      const ok = await fetch(`${shim.url}/api/healthcheck`, { signal: AbortSignal.timeout(5_000) })
        .then(async (r) => {
          await r.body?.cancel();
          return r.status === 200;
        })
        .catch(() => false);
      if (ok) return shim;
      await sleep(100);
    }
    throw new Error(`supervised shim on ${port} did not answer:\n${shim.logs.slice(-4000)}`);
  }

  /**
   * The wall-clock times (ms) at which the supervisor saw its shim exit (the field `time` of
   * its "shim exited; restarting" lines), in order.
   */
  exits(): number[] {
    return logTimes(this.logs, "shim exited; restarting");
  }

  /**
   * What the first restart that began in [from, to] (wall-clock ms) was made of, from the logs
   * of the supervisor and of the shim: the old shim drains and exits → new process spawned → its
   * Node.js and bundle loaded (phase `restoring`) → tasks restored → serving. Undefined if none
   * began then.
   */
  restartStages(from: number, to: number): RestartStages | undefined {
    const exited = this.exits().find((t) => t >= from && t <= to);
    if (exited === undefined) return undefined;
    const next = (message: string, fields?: Record<string, string>): number =>
      logTimes(this.logs, message, fields).find((t) => t >= exited) ?? Number.NaN;
    const draining = logTimes(this.logs, "shim phase", { phase: "draining" }).findLast((t) => t <= exited);
    const spawned = next("shim started");
    const loaded = next("shim phase", { phase: "restoring" });
    const restored = next("tasks restored");
    const serving = next("taskshim serving");
    return {
      drainMs: exited - (draining ?? Number.NaN),
      spawnMs: spawned - exited,
      loadMs: loaded - spawned,
      restoreMs: restored - loaded,
      serveMs: serving - restored,
    };
  }

  /** SIGTERM to the supervisor (forwarded to the shim; containers keep running), then SIGKILL. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((done) => this.child.once("exit", () => done()));
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => {
      if (this.child.pid !== undefined) process.kill(-this.child.pid, "SIGKILL");
    }, 15_000);
    await exited;
    clearTimeout(timer);
  }
}

/** The stages of one supervised restart, ms (see {@link SupervisedShim.restartStages}). */
export interface RestartStages {
  /** The old shim's phase `draining` → the supervisor saw it exit. */
  readonly drainMs: number;
  /** The old shim's exit → the supervisor has spawned the new process. */
  readonly spawnMs: number;
  /** Spawned → Node.js and the bundle loaded, the restore begins (phase `restoring`). */
  readonly loadMs: number;
  /** The restore (task.json files, the engine's list and inspects). */
  readonly restoreMs: number;
  /** Restored → listening and serving. */
  readonly serveMs: number;
}

/** "2 ECONNREFUSED, 1 UND_ERR_SOCKET", or "" when nothing failed. */
export function formatCauses(causes: ReadonlyMap<string, number>): string {
  return [...causes].map(([code, n]) => `${n} ${code}`).join(", ");
}

/** What the steady client saw: answers by version with their wall-clock times, and failures. */
export interface SteadyClientResult {
  readonly sent: number;
  readonly answered: number;
  /** Requests that failed without an answer (refused, reset, timed out). */
  readonly failed: number;
  /** Of those, connections refused (`ECONNREFUSED`: nothing held the port). */
  readonly refused: number;
  /** Of those, requests with no answer within {@link STEADY_CLIENT_TIMEOUT_MS} (`TimeoutError`). */
  readonly timedOut: number;
  /** Those failures by cause (`ECONNREFUSED`, `UND_ERR_SOCKET` = closed before the answer, …). */
  readonly causes: ReadonlyMap<string, number>;
  /** Wall-clock ms of the first answer that reported each version (healthcheck `version`). */
  readonly firstAnswerOf: ReadonlyMap<string, number>;
  /** The slowest answer, ms. */
  readonly maxLatencyMs: number;
}

/** How long the steady client waits for an answer: a control plane's order (dstack's is 15 s). */
export const STEADY_CLIENT_TIMEOUT_MS = 10_000;

/**
 * An open-loop client: one `GET /api/healthcheck` every `1000 / rate` ms, whether or not the
 * previous ones have been answered (a request made while no shim runs waits in the held
 * socket's backlog), until `stop()`; then waits for the requests in flight.
 */
export function steadyClient(url: string, rate: number): { stop: () => Promise<SteadyClientResult> } {
  let running = true;
  let sent = 0;
  let answered = 0;
  let failed = 0;
  let maxLatencyMs = 0;
  const firstAnswerOf = new Map<string, number>();
  const causes = new Map<string, number>();
  const inFlight = new Set<Promise<void>>();
  const one = async (): Promise<void> => {
    const started = performance.now();
    try {
      const response = await fetch(`${url}/api/healthcheck`, {
        signal: AbortSignal.timeout(STEADY_CLIENT_TIMEOUT_MS),
      });
      const body = (await response.json()) as { version?: string };
      const at = Date.now();
      answered++;
      maxLatencyMs = Math.max(maxLatencyMs, performance.now() - started);
      const version = body.version ?? "?";
      const seen = firstAnswerOf.get(version);
      if (seen === undefined || at < seen) firstAnswerOf.set(version, at);
    } catch (error) {
      failed++;
      const cause = (error as { cause?: { code?: string; name?: string } }).cause;
      const code = cause?.code ?? cause?.name ?? (error as Error).name;
      causes.set(code, (causes.get(code) ?? 0) + 1);
    }
  };
  const loop = (async () => {
    const interval = 1000 / rate;
    const start = performance.now();
    while (running) {
      sent++;
      const p = one();
      inFlight.add(p);
      void p.finally(() => inFlight.delete(p));
      const next = start + sent * interval;
      await sleep(Math.max(0, next - performance.now()));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      await Promise.all([...inFlight]);
      return {
        sent,
        answered,
        failed,
        refused: causes.get("ECONNREFUSED") ?? 0,
        timedOut: causes.get("TimeoutError") ?? 0,
        causes,
        firstAnswerOf,
        maxLatencyMs,
      };
    },
  };
}

/** One shim's line of `taskshim upgrade --json`. */
export interface UpgradeRow {
  readonly shim: string;
  readonly outcome: string;
  readonly windowMs: number | null;
  readonly tasksBefore: number;
  readonly tasksKept: number;
  readonly error?: string;
}

/** `taskshim upgrade --json` (run by binary `runner`) to `target` on the given shims. */
export async function runUpgrade(
  runner: RolloutBinary,
  target: RolloutBinary,
  shims: { shim?: string; shimsFile?: string; concurrency?: number },
): Promise<{ ms: number; results: UpgradeRow[] }> {
  const args = ["upgrade", "--url", `file://${target.path}`, "--sha256", target.sha256, "--json"];
  if (shims.shim) args.push("--shim", shims.shim);
  if (shims.shimsFile) args.push("--shims", shims.shimsFile);
  if (shims.concurrency) args.push("--concurrency", String(shims.concurrency));
  const started = performance.now();
  // Exit 1 when a shim failed: its JSON on stdout still says which and why.
  const stdout = await execFileAsync(runner.path, args, {
    timeout: 20 * 60_000,
    maxBuffer: 16 * 1024 * 1024,
  }).then(
    (r) => r.stdout,
    (error: unknown) => {
      const out = (error as { stdout?: string }).stdout;
      if (!out) throw error;
      return out;
    },
  );
  const ms = performance.now() - started;
  return { ms, results: JSON.parse(stdout) as UpgradeRow[] };
}
