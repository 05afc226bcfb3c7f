/*
 * The shim's composition: configuration and what the start found → the concrete parts, wired.
 * Wiring only: nothing here waits, reads the disk or calls the engine; the start (start-shim.ts)
 * decides when each part is built and what runs when. This is the one place that builds the
 * concrete adapters (the command runner, the guarded engine client, the GPU lock, the host's
 * keys and volumes) and hands them to the runner as a `RunnerContext`, whose ports are what the
 * unit tests fake.
 */
import { join } from "node:path";
import { isSea } from "node:sea";
import type { Logger } from "pino";
import { ShimMetrics } from "../api/metrics.js";
import { buildApi } from "../api/server.js";
import { ComponentService } from "../components/component-service.js";
import { fileIdentity } from "../components/file-identity.js";
import { containerParamsOf, type ShimConfig } from "../config/shim-config.js";
import type { DockerodeClient } from "../docker/dockerode-client.js";
import type { EngineIdentity } from "../docker/engine-info.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { AuthorizedKeys, HostKeysReconciler, passwdUserLookup } from "../host/authorized-keys.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { GpuLock } from "../host/gpu-lock.js";
import { HostVolumes } from "../host/volumes.js";
import { GuardedDockerClient, type EngineGuard } from "../runner/engine-guard.js";
import { ContainerOwnership } from "../runner/ownership.js";
import { Reconciler } from "../runner/reconciler.js";
import type { RunnerContext } from "../runner/runner-context.js";
import { TaskRunner } from "../runner/task-runner.js";
import type { HomeWatch } from "../state/home-watch.js";
import type { LogFileSink } from "../state/log-file-sink.js";
import { StorageHealth } from "../state/storage-health.js";
import { TaskDirs } from "../state/task-dirs.js";
import { TaskStore } from "../tasks/task-store.js";
import { VERSION } from "../version.js";
import { shimHandoff, type ShimHandoff } from "./connection-handoff.js";
import type { DcgmParts } from "./dcgm-setup.js";
import type { ShimShutdown } from "./shutdown.js";

/** The parts the start needs before the engine answers: the store, the task dirs, metrics, commands, storage. */
export interface ShimBase {
  readonly store: TaskStore;
  readonly dirs: TaskDirs;
  readonly metrics: ShimMetrics;
  readonly commands: BoundedCommandRunner;
  readonly storage: StorageHealth;
  /** Binds the storage probe's catch-up to the runner, once it exists. */
  catchUpWith(runner: TaskRunner): void;
}

/** Builds the {@link ShimBase}: the metrics follow the lifecycle and the log's dropped lines. */
export function composeBase(
  config: ShimConfig,
  log: Logger,
  logFile: LogFileSink,
  shutdown: ShimShutdown,
): ShimBase {
  const store = new TaskStore();
  const metrics = new ShimMetrics(store, VERSION);
  metrics.setPhase(shutdown.lifecycle.phase);
  shutdown.lifecycle.onChange((view) => metrics.setPhase(view.phase));
  metrics.logLinesDropped.inc(logFile.state().droppedLines);
  logFile.onDropped = (lines) => metrics.logLinesDropped.inc(lines);
  const commands = new BoundedCommandRunner(shutdown.interruptSignal);
  // Bound once the TaskRunner exists: what a degraded home could not take is written when the
  // probe finds it writable again.
  let catchUp: () => Promise<boolean> = () => Promise.resolve(true);
  const storage = new StorageHealth(join(config.home, "runners"), {
    log: (level, fields, msg) => log[level](fields, msg),
    observe: (up) => metrics.storageUp.set(up ? 1 : 0),
    catchUp: () => catchUp(),
  });
  return {
    store,
    dirs: new TaskDirs(config.home),
    metrics,
    commands,
    storage,
    catchUpWith: (runner) => (catchUp = () => runner.catchUpStorage()),
  };
}

/** What the start found out before the runner is built (startup steps 4 and 5). */
export interface StartFindings {
  readonly docker: DockerodeClient;
  readonly engine: EngineIdentity;
  readonly engineGuard: EngineGuard;
  readonly inventory: GpuInventory;
  readonly homeId: string;
  readonly bootId: string;
}

/** The runner and what acts beside it. */
export interface ShimRunner {
  readonly ctx: RunnerContext;
  readonly runner: TaskRunner;
  readonly reconciler: Reconciler;
  readonly components: ComponentService;
}

/** Builds the runner's context over the concrete adapters, the runner, the reconciler, the components. */
export function composeRunner(
  config: ShimConfig,
  base: ShimBase,
  found: StartFindings,
  log: Logger,
  shutdown: ShimShutdown,
): ShimRunner {
  const { metrics, commands } = base;
  const ctx: RunnerContext = {
    docker: new GuardedDockerClient(found.docker, found.engineGuard),
    engineGuard: found.engineGuard,
    store: base.store,
    dirs: base.dirs,
    inventory: found.inventory,
    gpuLock: new GpuLock(found.inventory),
    hostKeys: new HostKeysReconciler(
      new AuthorizedKeys(passwdUserLookup(config.testing.passwdFile), (msg, fields) =>
        log.warn(fields ?? {}, msg),
      ),
    ),
    volumes: new HostVolumes(commands, {
      mountRoot: config.volumeMountRoot,
      diskByIdDir: config.testing.diskByIdDir,
    }),
    params: containerParamsOf(config),
    ownership: new ContainerOwnership(found.homeId, config.adoptUnowned, log, (n) =>
      metrics.foreignContainers.set(n),
    ),
    bootId: found.bootId,
    log,
    shutdown: shutdown.signal,
    observer: {
      ...metrics.observer,
      engineSeen: (up) => {
        metrics.observer.engineSeen(up);
        found.engine.seen(up, shutdown.signal);
      },
    },
    storage: base.storage,
  };
  const runner = new TaskRunner(ctx);
  base.catchUpWith(runner);
  const reconciler = new Reconciler(ctx, runner);
  const components = new ComponentService(
    { runner: config.runnerBinaryPath, shim: config.shimBinaryPath },
    commands,
    log,
    shutdown.signal,
    {
      home: config.home,
      allowShimHandover: config.allowShimHandover,
      // Only the single binary knows exactly what runs: node runs a bundle by its path.
      ...(isSea() ? { runningExecutable: () => fileIdentity("/proc/self/exe") } : {}),
    },
  );
  return { ctx, runner, reconciler, components };
}

/** The HTTP edge, built (not listening), and the handoff of its connections under `supervise`. */
export interface ShimApi {
  readonly app: ReturnType<typeof buildApi>;
  readonly handoff: ShimHandoff | undefined;
}

/** Builds the HTTP edge over the runner; its shutdown route asks `shutdown`. */
export function composeApi(
  config: ShimConfig,
  parts: ShimBase & ShimRunner & { readonly homeWatch: HomeWatch; readonly dcgm: DcgmParts },
  found: StartFindings,
  authToken: string | undefined,
  log: Logger,
  shutdown: ShimShutdown,
): ShimApi {
  // Under `taskshim supervise`: kept-alive connections go to the next shim, not closed.
  const handoff = shimHandoff();
  const { dcgm, homeWatch } = parts;
  const app = buildApi({
    version: VERSION,
    store: parts.ctx.store,
    docker: parts.ctx.docker,
    runner: parts.runner,
    reconciler: parts.reconciler,
    inventory: found.inventory,
    components: parts.components,
    log,
    metrics: parts.metrics,
    storage: parts.storage,
    ...(authToken !== undefined ? { authToken } : {}),
    requestShutdown: (force) => shutdown.request(force),
    homeHealth: () => homeWatch.current(),
    ...(handoff ? { handoff } : {}),
    eventStreams: { maxStreams: config.maxEventStreams },
    engineInfo: () => found.engine.current(),
    engineBinding: () => found.engineGuard.state(),
    lifecycle: () => shutdown.lifecycle.view,
    ...(dcgm.taskMetrics ? { taskMetrics: dcgm.taskMetrics } : {}),
    ...(dcgm.gpuHealth ? { gpuHealth: dcgm.gpuHealth } : {}),
  });
  return { app, handoff };
}
