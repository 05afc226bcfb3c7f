import { spawn, type ChildProcess } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import { untilAborted } from "../exec/until-aborted.js";
import { countersCsv } from "./exporter-counters.js";
import { EXPORTER_WRAPPER, groupGone, readCapped, signalGroup, Tail } from "./exporter-process.js";
import { ExporterUnavailableError, MetricsFetchError, type TaskMetricsSource } from "./ports.js";
import {
  describeCleanupFailure,
  killStaleExporters,
  removeExporterRecord,
  writeExporterRecord,
  type ProcessTable,
} from "./stale-exporter.js";

/*
 * DCGM Exporter as a supervised child, as dstack-shim runs it (runner/internal/shim/dcgm/
 * exporter.go, DCGMExporter.Start): a counters file, `-f <csv> -a localhost:<port> -c <ms>`,
 * SIGTERM at the stop. Beyond dstack-shim: its start is bounded (it must answer /metrics within
 * `readyMs`, else it is killed and started again), it is started again with exponential backoff
 * whenever it dies, its stop is bounded (SIGTERM, SIGKILL after `stopGraceMs`) and awaited by the
 * shim's shutdown, and it never outlives the shim (stale-exporter.ts).
 */

/** Log lines of the supervisor: a level, fields, a message. */
export type DcgmLog = (
  level: "debug" | "info" | "warn" | "error",
  fields: Record<string, unknown>,
  msg: string,
) => void;

/** The supervisor's bounds and delays. */
export interface ExporterTimings {
  /** How long a start may take until `/metrics` answers 200. DCGM's own start takes seconds. */
  readonly readyMs: number;
  /** How often `/metrics` is asked while starting. */
  readonly readyPollMs: number;
  /** The first delay before a start again; doubled after each failure up to `backoffMaxMs`. */
  readonly backoffBaseMs: number;
  readonly backoffMaxMs: number;
  /** An exporter that served this long resets the backoff. */
  readonly stableMs: number;
  /** SIGTERM to SIGKILL, at the stop and for a stale exporter. */
  readonly stopGraceMs: number;
  /** A fetch of `/metrics` for a task's metrics (dstack-shim's HTTP client timeout). */
  readonly fetchTimeoutMs: number;
}

/** Production timings. */
export const EXPORTER_TIMINGS: ExporterTimings = {
  readyMs: 30_000,
  readyPollMs: 250,
  backoffBaseMs: 1_000,
  backoffMaxMs: 60_000,
  stableMs: 60_000,
  stopGraceMs: 5_000,
  fetchTimeoutMs: 10_000,
};

/** The largest `/metrics` answer read (a host of 8 GPUs answers ~100 KiB). */
export const EXPOSITION_CAP_BYTES = 32 * 1024 * 1024;

/** Where the supervisor stands. */
export type ExporterState =
  | { readonly kind: "idle" }
  | { readonly kind: "starting"; readonly attempt: number; readonly pid: number }
  | { readonly kind: "serving"; readonly pid: number; readonly since: number }
  | { readonly kind: "backoff"; readonly attempt: number; readonly delayMs: number; readonly error: string }
  | { readonly kind: "unavailable"; readonly error: string }
  | { readonly kind: "stopped" };

/** Options of {@link ExporterSupervisor}. */
export interface ExporterOptions {
  /** The `dcgm-exporter` executable (found on PATH). */
  readonly executable: string;
  readonly port: number;
  readonly intervalMs: number;
  /** The shim's home: the pid file lives there. */
  readonly home: string;
  readonly log: DcgmLog;
  readonly timings?: Partial<ExporterTimings>;
  /**
   * Checks the executable before the first start (dstack-shim runs `dcgm-exporter -v`); a
   * rejection means no exporter for this shim's life, logged once.
   */
  readonly versionCheck?: () => Promise<string>;
  /** The process table the stale cleanup reads (tests). */
  readonly processTable?: ProcessTable;
}

/** One running wrapper and its exporter. */
interface Running {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly tail: Tail;
}

/**
 * Runs DCGM Exporter for the shim's life and serves its answer to the task-metrics route.
 * `run(shutdown)` is the whole life: it resolves once the exporter is stopped after `shutdown`
 * aborts (within `stopGraceMs` and a little more), and never rejects.
 */
export class ExporterSupervisor implements TaskMetricsSource {
  private readonly timings: ExporterTimings;
  private current: ExporterState = { kind: "idle" };
  private cached: { readonly at: number; readonly text: string } | undefined;
  private inFlight: Promise<string> | undefined;

  constructor(private readonly options: ExporterOptions) {
    this.timings = { ...EXPORTER_TIMINGS, ...options.timings };
  }

  /** The URL the exporter serves its metrics at. */
  get url(): string {
    return `http://localhost:${this.options.port}/metrics`;
  }

  /** Where the supervisor stands now. */
  state(): ExporterState {
    return this.current;
  }

  async run(shutdown: AbortSignal): Promise<void> {
    const { log } = this.options;
    if (this.options.versionCheck) {
      try {
        const version = await this.options.versionCheck();
        log(
          "info",
          { version: version.trim().split("\n")[0] ?? "", port: this.options.port },
          "using DCGM Exporter",
        );
      } catch (error) {
        log("warn", { error: errorMessage(error) }, "not using DCGM Exporter: its version check failed");
        this.current = { kind: "unavailable", error: errorMessage(error) };
        return;
      }
    }
    try {
      const cleanup = await killStaleExporters({
        home: this.options.home,
        executable: this.options.executable,
        port: this.options.port,
        graceMs: this.timings.stopGraceMs,
        ...(this.options.processTable ? { table: this.options.processTable } : {}),
      });
      if (cleanup.killed.length > 0) {
        log(
          "warn",
          { pids: cleanup.killed.map((p) => p.pid), forced: cleanup.forced },
          "stopped a DCGM Exporter left by an earlier shim",
        );
      }
    } catch (error) {
      log("warn", { error: errorMessage(error) }, describeCleanupFailure(error));
    }
    let dir: string;
    try {
      dir = await mkdtemp(join(tmpdir(), "taskshim-dcgm-"));
      await writeFile(join(dir, "counters.csv"), countersCsv(), { mode: 0o644 });
    } catch (error) {
      log(
        "error",
        { error: errorMessage(error) },
        "cannot write DCGM Exporter's counters file; not running it",
      );
      this.current = { kind: "unavailable", error: errorMessage(error) };
      return;
    }
    try {
      await this.loop(join(dir, "counters.csv"), shutdown);
    } finally {
      if (this.current.kind !== "unavailable") this.current = { kind: "stopped" };
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      await removeExporterRecord(this.options.home).catch(() => undefined);
    }
  }

  private async loop(countersFile: string, shutdown: AbortSignal): Promise<void> {
    const { log } = this.options;
    let failures = 0;
    let attempt = 0;
    while (!shutdown.aborted) {
      attempt += 1;
      const running = await this.spawn(countersFile);
      if (running === undefined) {
        failures += 1;
      } else {
        this.current = { kind: "starting", attempt, pid: running.pid };
        const ready = await this.waitReady(running, shutdown);
        if (ready === "ready") {
          const since = performance.now();
          this.current = { kind: "serving", pid: running.pid, since };
          log("info", { pid: running.pid, port: this.options.port, attempt }, "DCGM Exporter serving");
          // `exited` never rejects: a rejection here can only be the shutdown's abort.
          const end = await untilAborted(running.exited, shutdown).catch(() => "aborted" as const);
          if (end === "aborted") {
            await this.stop(running);
            return;
          }
          // What is left of its group (an exporter whose wrapper alone was killed) goes too.
          await this.stop(running);
          failures = performance.now() - since >= this.timings.stableMs ? 1 : failures + 1;
          log(
            "warn",
            { pid: running.pid, code: end.code, signal: end.signal, last: running.tail.lastLine() },
            "DCGM Exporter exited; starting it again",
          );
        } else {
          if (ready === "aborted") {
            await this.stop(running);
            return;
          }
          failures += 1;
          if (ready === "timeout") {
            log(
              "warn",
              { pid: running.pid, readyMs: this.timings.readyMs, last: running.tail.lastLine() },
              "DCGM Exporter did not answer /metrics in time; stopping it and starting it again",
            );
            await this.stop(running);
          } else {
            log(
              "warn",
              { code: ready.code, signal: ready.signal, last: running.tail.lastLine() },
              "DCGM Exporter exited before it served; starting it again",
            );
            await this.stop(running);
          }
        }
      }
      const delayMs = Math.min(
        this.timings.backoffMaxMs,
        this.timings.backoffBaseMs * 2 ** Math.max(0, failures - 1),
      );
      this.current = { kind: "backoff", attempt, delayMs, error: "exited or not ready" };
      await sleep(delayMs, undefined, { signal: shutdown }).catch(() => undefined);
    }
  }

  private async spawn(countersFile: string): Promise<Running | undefined> {
    const { executable, port, intervalMs, log, home } = this.options;
    // dstack-shim's arguments: the counters file, the listen address, the collect interval.
    const argv = [executable, "-f", countersFile, "-a", `localhost:${port}`, "-c", String(intervalMs)];
    let child: ChildProcess;
    try {
      // Its own process group: what the stop's SIGKILL reaches, and what the next start looks for.
      child = spawn("/bin/sh", ["-c", EXPORTER_WRAPPER, "dcgm-exporter-wrapper", ...argv], {
        detached: true,
        stdio: ["pipe", "pipe", "pipe"],
      });
    } catch (error) {
      log("error", { error: errorMessage(error) }, "cannot start DCGM Exporter");
      return undefined;
    }
    const pid = child.pid;
    if (pid === undefined) {
      child.on("error", () => undefined);
      log("error", { executable }, "cannot start DCGM Exporter (no pid)");
      return undefined;
    }
    const tail = new Tail(4096);
    child.stdout?.on("data", (chunk: Buffer) => tail.push(chunk));
    child.stderr?.on("data", (chunk: Buffer) => tail.push(chunk));
    // The pipe stays open and unwritten for the exporter's life (the wrapper's "shim is alive").
    child.stdin?.on("error", () => undefined);
    // The shim's event loop must not be kept alive by the exporter alone.
    child.unref();
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
      child.once("exit", (code, signal) => resolve({ code, signal }));
      child.once("error", () => resolve({ code: null, signal: null }));
    });
    // Recorded before it counts as started: a shim killed from here on leaves a record to clean.
    await writeExporterRecord(home, { pgid: pid, executable, port }).catch((error: unknown) =>
      log(
        "warn",
        { error: errorMessage(error) },
        "cannot record DCGM Exporter's pid; only its wrapper guards it",
      ),
    );
    return { child, pid, exited, tail };
  }

  /** Asks `/metrics` until it answers 200, the exporter exits, the bound passes or the shim stops. */
  private async waitReady(
    running: Running,
    shutdown: AbortSignal,
  ): Promise<"ready" | "timeout" | "aborted" | { code: number | null; signal: NodeJS.Signals | null }> {
    const deadline = performance.now() + this.timings.readyMs;
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    void running.exited.then((e) => (exit = e));
    while (performance.now() < deadline) {
      if (shutdown.aborted) return "aborted";
      if (exit !== undefined) return exit;
      const remaining = deadline - performance.now();
      try {
        const response = await fetch(this.url, {
          signal: AbortSignal.any([shutdown, AbortSignal.timeout(Math.max(1, Math.min(2_000, remaining)))]),
        });
        await response.body?.cancel();
        if (response.status === 200) return "ready";
      } catch {
        // Not listening yet.
      }
      if (exit !== undefined) return exit;
      await sleep(this.timings.readyPollMs, undefined, { signal: shutdown }).catch(() => undefined);
    }
    return shutdown.aborted ? "aborted" : (exit ?? "timeout");
  }

  /**
   * SIGTERM to the wrapper (it passes it to the exporter and waits for it), SIGKILL to what is
   * left of the group after the grace; resolves once no live process of the group is left.
   */
  private async stop(running: Running): Promise<void> {
    if (running.child.exitCode === null && running.child.signalCode === null) {
      try {
        process.kill(running.pid, "SIGTERM");
      } catch {
        // Already gone.
      }
    }
    if (!(await groupGone(running.pid, this.timings.stopGraceMs))) {
      this.options.log("warn", { pid: running.pid }, "DCGM Exporter ignored SIGTERM; killing it");
      signalGroup(running.pid, "SIGKILL");
      await groupGone(running.pid, 1_000);
    }
    running.child.stdin?.destroy();
    this.cached = undefined;
  }

  async exposition(signal: AbortSignal): Promise<string> {
    if (this.current.kind === "unavailable") throw new ExporterUnavailableError(this.current.error);
    if (this.current.kind !== "serving") {
      throw new MetricsFetchError(`DCGM Exporter is not serving (${this.current.kind})`);
    }
    // dstack-shim's rule: an answer younger than the collect interval is served again.
    if (this.cached && performance.now() - this.cached.at < this.options.intervalMs) return this.cached.text;
    this.inFlight ??= this.fetchOnce().finally(() => (this.inFlight = undefined));
    // A caller that goes away stops waiting; the fetch goes on for the others.
    return untilAborted(this.inFlight, signal).catch((error: unknown) => {
      throw signal.aborted ? new MetricsFetchError("the request was cancelled", { cause: error }) : error;
    });
  }

  private async fetchOnce(): Promise<string> {
    const startedAt = performance.now();
    let response: Response;
    try {
      response = await fetch(this.url, { signal: AbortSignal.timeout(this.timings.fetchTimeoutMs) });
    } catch (error) {
      throw new MetricsFetchError(`cannot fetch ${this.url}: ${errorMessage(error)}`, { cause: error });
    }
    if (response.status !== 200) {
      await response.body?.cancel();
      throw new MetricsFetchError(`${this.url} answered ${response.status}`);
    }
    const text = await readCapped(response, EXPOSITION_CAP_BYTES).catch((error: unknown) => {
      throw new MetricsFetchError(`cannot read ${this.url}: ${errorMessage(error)}`, { cause: error });
    });
    this.cached = { at: startedAt, text };
    return text;
  }
}
