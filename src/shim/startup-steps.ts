/*
 * Steps 4 to 8 of the start (docs/architecture.md, "Startup"): reach the engine and survey the
 * host, recover the tasks, check the components, then serve and run the background. Each step is
 * one function; start-shim.ts calls them in order and composition (compose.ts) builds the parts
 * between them.
 */
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "pino";
import type { ShimMetrics } from "../api/metrics.js";
import type { ComponentService } from "../components/component-service.js";
import { ConfigError, type ShimConfig } from "../config/shim-config.js";
import { DockerodeClient } from "../docker/dockerode-client.js";
import { describeEngine } from "../docker/engine-fingerprint.js";
import {
  chooseEngineEndpoint,
  localEngineProbe,
  unreachableMessage,
  type EngineEndpoint,
} from "../docker/engine-endpoint.js";
import { EngineIdentity } from "../docker/engine-info.js";
import { errorMessage } from "../errors/error-message.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { onPath } from "../exec/on-path.js";
import { detectGpus, type GpuInventory } from "../host/gpu-inventory.js";
import { collectHostInfo, systemHostFacts } from "../host/host-info.js";
import { EngineGuard } from "../runner/engine-guard.js";
import { recover, type Recovery } from "../runner/recover.js";
import type { RestoreReads } from "../runner/restore.js";
import { loadEngineRecord, writeEngineRecord, type EngineRecord } from "../state/engine-record.js";
import { HomeIdentityError, loadHomeIdentity } from "../state/home-identity.js";
import { HOST_INFO_FILE, writeHostInfo } from "../state/host-info-file.js";
import { HomeWatch } from "../state/home-watch.js";
import type { StorageHealth } from "../state/storage-health.js";
import type { ShimApi, ShimBase, ShimRunner, StartFindings } from "./compose.js";
import type { DcgmParts } from "./dcgm-setup.js";
import { checkEngineBinding, engineRecordOf, identifyEngine, recordedEngine } from "./engine-binding.js";
import type { GlibcMalloc } from "./glibc-malloc.js";
import { startHeapTrim } from "./heap-trim.js";
import type { ListenTarget } from "./listen-target.js";
import type { DrainPlan, ShimShutdown } from "./shutdown.js";
import { unlessInterrupted } from "./start-interruption.js";
import { listenError, StartupError } from "./startup-checks.js";

/** The engine the start chose, with its clients, before it is asked anything. */
export interface ChosenEngine {
  readonly record: EngineRecord | undefined;
  readonly endpoint: EngineEndpoint;
  readonly docker: DockerodeClient;
  readonly engine: EngineIdentity;
}

/**
 * Step 4, first half: the engine this home's containers live on, if it has any (a damaged record
 * stops the start), then `--engine-url`, else `DOCKER_HOST`, else the home's engine, else Docker's
 * socket or rootful Podman's (one ping each at most).
 */
export async function chooseEngine(
  config: ShimConfig,
  metrics: ShimMetrics,
  log: Logger,
  signal: AbortSignal,
): Promise<ChosenEngine> {
  const record = await loadEngineRecord(config.home).catch((error: unknown) => {
    throw new ConfigError(errorMessage(error), { cause: error });
  });
  const endpoint = await chooseEngineEndpoint(
    { engineUrl: config.engineUrl, dockerHost: process.env.DOCKER_HOST, recordedUrl: record?.url },
    localEngineProbe((url) => DockerodeClient.fromUrl(url).ping(signal)),
  );
  const docker = DockerodeClient.fromUrl(endpoint.url, metrics.countEngineCall);
  // Which engine it is: detected once it answers, again whenever it is back after an outage.
  const engine = new EngineIdentity(docker, {
    log: (level, fields, msg) => log[level](fields, msg),
    changed: (info) => metrics.setEngine(info),
  });
  return { record, endpoint, docker, engine };
}

/** Step 5, started before step 4 and awaited with it: the host's GPUs, boot id and storage. */
export interface HostSurvey {
  /** The GPU detection, already under way (vendor tools are the slowest part of a restart). */
  readonly gpus: Promise<GpuInventory>;
  /** Reads the boot id (task.json's `boot_id`). */
  bootId(): Promise<string>;
  /**
   * Probes the home's storage once: a full or read-only home does not stop the start, it is
   * reported (healthcheck, metric) and probed until it takes writes again.
   */
  probeStorage(): Promise<unknown>;
}

/** Step 5: detects the GPUs at once (a fixture, else the vendor's tool) and readies the rest. */
export function surveyHost(
  config: ShimConfig,
  commands: CommandRunner,
  storage: StorageHealth,
  log: Logger,
): HostSurvey {
  const gpus = detectGpus(commands, {
    ...(config.gpuFixture ? { fixturePath: config.gpuFixture } : {}),
    log: (msg, fields) => log.warn(fields ?? {}, msg),
    installed: (tool) => onPath(tool),
  });
  gpus.catch(() => undefined); // awaited by reachEngine; a ping failure must not leave it unhandled
  return {
    gpus,
    bootId: async () => (await readFile(config.testing.bootIdFile, "utf8").catch(() => "unknown")).trim(),
    probeStorage: () => storage.check(),
  };
}

/** What steps 4 and 5 found together. */
export type ReachedEngine = Omit<StartFindings, "engineGuard"> & {
  readonly fingerprint: Awaited<ReturnType<typeof identifyEngine>>;
};

/**
 * Step 4, second half, with step 5 awaited beside it: the ping, which engine it is, the home's
 * identity, the GPUs, the boot id and the storage probe do not depend on each other, so a restart
 * waits for the slowest only. All of them end before a failure is reported: none still writes
 * into the home once the failed start has released its lock.
 */
export async function reachEngine(
  config: ShimConfig,
  chosen: ChosenEngine,
  host: HostSurvey,
  signal: AbortSignal,
  interrupted: AbortSignal | undefined,
): Promise<ReachedEngine> {
  const { docker, engine, endpoint } = chosen;
  const pinged = docker.ping().catch((error: unknown) => {
    throw new StartupError(unreachableMessage(endpoint, errorMessage(error)), { cause: error });
  });
  const identified = loadHomeIdentity(config.home).catch((error: unknown) => {
    if (error instanceof HomeIdentityError) throw new StartupError(error.message, { cause: error });
    throw new StartupError(`cannot create the home identity: ${errorMessage(error)}`, { cause: error });
  });
  const steps = [
    pinged.then(async () => {
      const [gpus, , fingerprint] = await Promise.all([
        host.gpus,
        engine.detect(signal),
        identifyEngine(docker, signal).catch((error: unknown) => {
          throw new StartupError(`cannot identify the engine at ${endpoint.url}: ${errorMessage(error)}`, {
            cause: error,
          });
        }),
      ]);
      return { gpus, fingerprint };
    }),
    identified,
    host.bootId(),
    host.probeStorage(),
  ] as const;
  await unlessInterrupted(Promise.allSettled(steps), interrupted);
  const [{ gpus: inventory, fingerprint }, homeId, bootId] = await Promise.all(steps);
  return { docker, engine, inventory, fingerprint, homeId, bootId };
}

/**
 * Step 4, last: the home bound to the engine it found (a home that moved is logged), the guard
 * that keeps it so, and the watch of the home (deleted or replaced: healthcheck `storage:
 * degraded`), stopped with the shim.
 */
export async function bindEngine(
  config: ShimConfig,
  chosen: ChosenEngine,
  reached: ReachedEngine,
  log: Logger,
  shutdown: ShimShutdown,
): Promise<{ engineGuard: EngineGuard; homeWatch: HomeWatch }> {
  const { endpoint } = chosen;
  const { fingerprint, homeId } = reached;
  const binding = await checkEngineBinding({
    home: config.home,
    homeId,
    record: chosen.record,
    current: fingerprint,
    endpoint,
  });
  if (binding.kind === "moved") {
    log.warn(
      { from: binding.from.url, fromEngine: describeEngine(recordedEngine(binding.from)), to: endpoint.url },
      "this home moved to another engine (--engine-url); the recorded one runs none of its containers",
    );
  }
  const engineGuard = new EngineGuard(
    chosen.docker,
    binding.kind === "unbound" ? undefined : fingerprint,
    (bound) => writeEngineRecord(config.home, engineRecordOf(bound, endpoint.url)),
    log,
  );
  const homeWatch = await HomeWatch.start(config.home, homeId, log);
  shutdown.atStop(() => homeWatch.stop());
  return { engineGuard, homeWatch };
}

/**
 * Step 6: the recovery (runner/recover.ts: restore, persist what it reconciled, the first tick,
 * host keys), a home from before engine records bound to the engine its tasks were found on, and
 * the restore's counts in the metrics. The cut starts resume once the API serves.
 */
export async function recoverTasks(
  parts: ShimBase & ShimRunner,
  engineGuard: EngineGuard,
  begun: RestoreReads,
  log: Logger,
  shutdown: ShimShutdown,
  interrupted: AbortSignal | undefined,
): Promise<Recovery> {
  shutdown.restoring();
  const { ctx, runner, reconciler, metrics } = parts;
  const recovery = await unlessInterrupted(recover({ ctx, runner, reconciler }, begun), interrupted);
  const report = recovery.report;
  if (engineGuard.state().state === "unbound" && parts.store.list().length > 0) {
    await engineGuard.verify(shutdown.signal).catch((error: unknown) => {
      log.warn(
        { err: error },
        "cannot record this home's engine yet; retried before the next container is created",
      );
    });
  }
  metrics.restoredTasks.set(report.restored);
  metrics.quarantined.set({ kind: "corrupt" }, report.quarantineHeld);
  metrics.quarantined.set({ kind: "newer-format" }, report.skippedNewer.length);
  metrics.quarantined.set({ kind: "quarantine-failed" }, report.quarantineFailed.length);
  metrics.quarantineFailures.inc(report.quarantineFailed.length);
  return recovery;
}

/** Step 7: the component version check in the background, then the runner's download if missing. */
export function checkComponents(config: ShimConfig, components: ComponentService): Promise<void> {
  return components.refresh().then(() => {
    if (config.runnerDownloadUrl && !existsSync(config.runnerBinaryPath)) {
      components.install("dstack-runner", config.runnerDownloadUrl, undefined);
    }
  });
}

/**
 * Step 8, first half: listen, once the routes are compiled (`ready`), on the address of the
 * flags or the socket passed in, and take connections handed over by the previous shim. Returns
 * the address actually served.
 */
export async function listen(
  config: ShimConfig,
  api: ShimApi,
  ready: Promise<void>,
  target: ListenTarget,
  interrupted: AbortSignal | undefined,
): Promise<string> {
  const { app, handoff } = api;
  await unlessInterrupted(ready, interrupted);
  interrupted?.throwIfAborted();
  try {
    // fastify hands its options to net.Server#listen, which serves `fd` and then ignores
    // `host`; a host other than "localhost" keeps fastify from adding a second (::1) binding.
    const inherited = { fd: target.kind === "inherited" ? target.fd : -1, host: "127.0.0.1" };
    await app.listen(target.kind === "inherited" ? inherited : target);
  } catch (error) {
    // The configured port is not what failed when the socket was passed in: name the descriptor.
    if (target.kind === "inherited") {
      throw new StartupError(
        `cannot serve fd ${target.fd} (LISTEN_FDS=1): ${errorMessage(error).replace(/\s*\n\s*/g, " ")}`,
        { cause: error },
      );
    }
    throw listenError(error, config.httpAddress, config.httpPort);
  }
  handoff?.accept(app.server);
  // The socket actually served: systemd's, when socket-activated, may differ from the flags.
  const bound = app.server.address();
  return bound !== null && typeof bound === "object"
    ? `http://${bound.address}:${bound.port}`
    : `http://${config.httpAddress}:${config.httpPort}`;
}

/**
 * Step 8, second half: the reconcile loop, the Docker event follower, the storage probe loop,
 * DCGM, the cut starts, the idle heap trim and service mode's `host_info.json`. Returns what the
 * shutdown stops and waits for.
 */
export function runInBackground(
  config: ShimConfig,
  parts: ShimBase & ShimRunner & { readonly app: ShimApi["app"]; readonly dcgm: DcgmParts },
  found: { readonly inventory: GpuInventory; readonly docker: DockerodeClient },
  recovery: Recovery,
  componentCheck: Promise<void>,
  malloc: GlibcMalloc | undefined,
  log: Logger,
  signal: AbortSignal,
): DrainPlan {
  const { app, reconciler, runner, components } = parts;
  const loop = reconciler.run();
  const events = config.testing.noEvents ? Promise.resolve() : reconciler.followEvents();
  const probing = parts.storage.run(signal);
  const dcgmRunning = parts.dcgm.start(signal);
  recovery.resumeStarts();
  const stopHeapTrim = startHeapTrim({ releaseMalloc: malloc?.trim });
  // Service mode: the API answers by the time the file appears (dstack's server reads it, then
  // asks the healthcheck at once).
  const hostInfo = config.serviceMode
    ? publishHostInfo(config.home, found, parts.commands, log, signal)
    : Promise.resolve();
  return {
    closeConnections: () => app.server.closeAllConnections(),
    stopNow: () => {
      stopHeapTrim();
      runner.cancelPulls();
    },
    steps: () => ({
      api: app.close(),
      reconcileLoop: loop,
      eventStream: events,
      storageProbe: probing,
      componentCheck,
      starts: runner.awaitStarts(),
      installs: components.settle(),
      hostInfo,
      dcgm: dcgmRunning,
    }),
  };
}

/**
 * Writes service mode's `host_info.json` (dstack-shim's rules: once per start, only when absent).
 * Never fails the shim: a full or read-only home is reported by the storage health already, and
 * the log says what the server will miss.
 */
async function publishHostInfo(
  home: string,
  found: { readonly inventory: GpuInventory; readonly docker: DockerodeClient },
  commands: CommandRunner,
  log: Logger,
  signal: AbortSignal,
): Promise<void> {
  try {
    const facts = systemHostFacts(commands);
    const { info, problems } = await collectHostInfo(found.inventory, facts, found.docker, signal);
    for (const problem of problems)
      log.warn(problem, "host_info.json: a host fact could not be read; written as 0 or empty");
    const written = await writeHostInfo(home, info);
    if (written === "exists")
      log.info({ file: join(home, HOST_INFO_FILE) }, "host_info.json exists; left as it is");
    else log.info({ file: join(home, HOST_INFO_FILE), ...info }, "host_info.json written");
  } catch (error) {
    log.error({ err: error, file: join(home, HOST_INFO_FILE) }, "cannot write host_info.json (service mode)");
  }
}
