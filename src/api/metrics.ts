import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EngineInfo } from "../docker/engine-info.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { SHIM_PHASES, type ShimPhase } from "../lifecycle/shim-lifecycle.js";
import type { RunnerObserver } from "../runner/runner-context.js";
import type { TaskStore } from "../tasks/task-store.js";
import { TASK_STATUSES } from "../tasks/task-status.js";
import { BUILD, type BuildIdentity } from "../version.js";

/**
 * The shim's Prometheus metrics. Labels stay bounded — status, reason, operation, result —
 * never a task id.
 */
export class ShimMetrics {
  readonly registry = new Registry();
  readonly engineCalls = new Counter({
    name: "taskshim_engine_calls_total",
    help: "Docker Engine API calls by operation and result",
    labelNames: ["op", "result"] as const,
    registers: [this.registry],
  });
  readonly tasksStarted = new Counter({
    name: "taskshim_tasks_started_total",
    help: "Tasks whose container was started",
    registers: [this.registry],
  });
  readonly tasksFinalized = new Counter({
    name: "taskshim_tasks_finalized_total",
    help: "Tasks that reached terminated, by termination reason",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  readonly reconcileTick = new Histogram({
    name: "taskshim_reconcile_tick_seconds",
    help: "Duration of one reconcile tick",
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
    registers: [this.registry],
  });
  readonly pullBytes = new Counter({
    name: "taskshim_pull_bytes_total",
    help: "Image bytes downloaded by pulls",
    registers: [this.registry],
  });
  readonly restoredTasks = new Gauge({
    name: "taskshim_restored_tasks",
    help: "Tasks restored from containers and state files at the last start",
    registers: [this.registry],
  });
  readonly engineCallSeconds = new Histogram({
    name: "taskshim_engine_call_duration_seconds",
    help: "Latency of Docker Engine API calls by operation (a stream: until its answer began)",
    labelNames: ["op"] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });
  readonly buildInfo = new Gauge({
    name: "taskshim_build_info",
    help: "Always 1; the labels say which build (version, commit, dirty tree, build id) runs on which Node.js",
    labelNames: ["version", "node", "commit", "dirty", "build_id"] as const,
    registers: [this.registry],
  });
  /**
   * The standard restart signal: a new value means a new process (`changes()` or
   * `resets()` over it count restarts). A counter of starts cannot: each process starts at 1.
   */
  readonly startTime = new Gauge({
    name: "process_start_time_seconds",
    help: "Start time of the shim process since the Unix epoch, in seconds",
    registers: [this.registry],
  });
  readonly quarantined = new Gauge({
    name: "taskshim_quarantined_state_files",
    help: "State files set aside at the last start: corrupt (held in the quarantine), newer-format (a newer release's, left alone), quarantine-failed (unreadable, left in place because the move failed)",
    labelNames: ["kind"] as const,
    registers: [this.registry],
  });
  readonly quarantineFailures = new Counter({
    name: "taskshim_quarantine_failures_total",
    help: "Unreadable state files and task dirs whose move to the quarantine failed (left in place, never written)",
    registers: [this.registry],
  });
  readonly connectionsRefused = new Counter({
    name: "taskshim_http_connections_refused_total",
    help: "HTTP connections refused because 1,000 were already open",
    registers: [this.registry],
  });
  readonly eventStreams = new Gauge({
    name: "taskshim_event_streams",
    help: "Open GET /api/events streams",
    registers: [this.registry],
  });
  readonly eventStreamsRefused = new Counter({
    name: "taskshim_event_streams_refused_total",
    help: "GET /api/events answered 503 because --max-event-streams were already open",
    registers: [this.registry],
  });
  readonly eventStreamsCutOff = new Counter({
    name: "taskshim_event_streams_cut_off_total",
    help: "GET /api/events streams cut off because their follower did not read (behind: backlog bound; stalled: time bound)",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  readonly foreignContainers = new Gauge({
    name: "taskshim_foreign_containers",
    help: "Labelled containers on the engine that are not this shim's (another home's, or unclaimed): never acted on",
    registers: [this.registry],
  });
  /** The engine's name and version as labels; no series until the engine is first detected. */
  readonly engineInfo = new Gauge({
    name: "taskshim_engine_info",
    help: "Always 1; the labels say which engine the shim drives (docker or podman) and its version",
    labelNames: ["engine", "version"] as const,
    registers: [this.registry],
  });
  /** The shim process's phase (lifecycle/shim-lifecycle.ts): 1 for the current one, 0 for the others. */
  readonly phase = new Gauge({
    name: "taskshim_phase",
    help: "1 for the shim's current lifecycle phase (starting, restoring, serving, draining, stopped, failed)",
    labelNames: ["phase"] as const,
    registers: [this.registry],
  });
  /** The accelerators detected at start; no series until then. */
  readonly gpus = new Gauge({
    name: "taskshim_gpus",
    help: "GPUs detected at start, labelled with their vendor (nvidia, amd, intel, tenstorrent; none without any)",
    labelNames: ["vendor"] as const,
    registers: [this.registry],
  });
  readonly engineUp = new Gauge({
    name: "taskshim_engine_up",
    help: "1 when the Docker Engine answered the last reconcile tick",
    registers: [this.registry],
  });

  readonly storageUp = new Gauge({
    name: "taskshim_storage_up",
    help: "1 when the shim's home takes durable writes, 0 while degraded (full, read-only, failing)",
    registers: [this.registry],
  });
  readonly logLinesDropped = new Counter({
    name: "taskshim_log_lines_dropped_total",
    help: "Log lines that could not be written to shim.log (full, read-only or failing disk)",
    registers: [this.registry],
  });

  /**
   * @param version the semver of `taskshim_build_info`.
   * @param build the rest of its build identity (this process's by default).
   */
  constructor(store?: TaskStore, version = "unknown", build: Omit<BuildIdentity, "version"> = BUILD) {
    this.buildInfo.set(
      {
        version,
        node: process.version,
        commit: build.commit,
        dirty: String(build.dirty),
        build_id: build.buildId,
      },
      1,
    );
    this.startTime.set(Math.round((Date.now() - process.uptime() * 1000) / 1000));
    // The event-loop lag histogram samples every 10 ms by default: 1-1.5 % of a core on its own,
    // most of the shim's idle cost. A 1 s resolution still shows a stalled loop.
    collectDefaultMetrics({
      register: this.registry,
      prefix: "taskshim_",
      eventLoopMonitoringPrecision: 1_000,
    });
    if (store) {
      new Gauge({
        name: "taskshim_tasks",
        help: "Tasks by status",
        labelNames: ["status"] as const,
        registers: [this.registry],
        collect() {
          const counts = new Map<string, number>(TASK_STATUSES.map((s) => [s, 0]));
          for (const task of store.list()) counts.set(task.status, (counts.get(task.status) ?? 0) + 1);
          for (const [status, count] of counts) this.set({ status }, count);
        },
      });
    }
  }

  /** The lifecycle engine's facts, turned into metrics. */
  readonly observer: RunnerObserver = {
    taskStarted: () => this.tasksStarted.inc(),
    taskFinalized: (reason) => this.tasksFinalized.inc({ reason }),
    tickDone: (seconds) => this.reconcileTick.observe(seconds),
    engineSeen: (up) => this.engineUp.set(up ? 1 : 0),
    pulledBytes: (bytes) => this.pullBytes.inc(bytes),
  };

  /** The engine was detected (again): one `taskshim_engine_info` series, for it alone. */
  setEngine(info: EngineInfo): void {
    this.engineInfo.reset();
    this.engineInfo.set({ engine: info.kind, version: info.version }, 1);
  }

  /** GPUs were detected: one `taskshim_gpus` series, labelled with the vendor. */
  setGpus(inventory: GpuInventory): void {
    this.gpus.reset();
    this.gpus.set({ vendor: inventory.vendor }, inventory.gpus.length);
  }

  /** The shim entered `current`: every phase is exported, so a scrape sees the move as 1 → 0. */
  setPhase(current: ShimPhase): void {
    for (const phase of SHIM_PHASES) this.phase.set({ phase }, phase === current ? 1 : 0);
  }

  /** A counter hook for the Docker adapter. */
  readonly countEngineCall = (op: string, result: "ok" | "error", seconds = 0): void => {
    this.engineCalls.inc({ op, result });
    this.engineCallSeconds.observe({ op }, seconds);
  };

  /**
   * The text exposition, without the blank lines prom-client puts between metrics (some
   * scrapers and every `grep | wc -l` trip over them).
   */
  async exposition(): Promise<string> {
    return (await this.registry.metrics()).replace(/\n{2,}/g, "\n");
  }
}
