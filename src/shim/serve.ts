import { setMaxListeners } from "node:events";
import { existsSync } from "node:fs";
import { mkdir, readFile, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { ShimMetrics } from "../api/metrics.js";
import { buildApi } from "../api/server.js";
import { ComponentService } from "../components/component-service.js";
import { ConfigError, containerParamsOf, type ShimConfig } from "../config/shim-config.js";
import { DockerodeClient } from "../docker/dockerode-client.js";
import { chooseEngineEndpoint, localEngineProbe, unreachableMessage } from "../docker/engine-endpoint.js";
import { EngineIdentity } from "../docker/engine-info.js";
import { onPath } from "../exec/on-path.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { AuthorizedKeys, HostKeysReconciler, passwdUserLookup } from "../host/authorized-keys.js";
import { detectGpus, type GpuInventory } from "../host/gpu-inventory.js";
import {
  collectHostInfo,
  systemHostFacts,
  type EngineStorageRoot,
  type HostFacts,
} from "../host/host-info.js";
import { HOST_INFO_FILE, writeHostInfo } from "../state/host-info-file.js";
import { GpuLock } from "../host/gpu-lock.js";
import { HostVolumes } from "../host/volumes.js";
import { armFailpoints } from "../runner/failpoints.js";
import { Reconciler } from "../runner/reconciler.js";
import { recover } from "../runner/recover.js";
import type { RunnerContext } from "../runner/runner-context.js";
import { ContainerOwnership } from "../runner/ownership.js";
import { TaskRunner } from "../runner/task-runner.js";
import { HomeIdentityError, loadHomeIdentity } from "../state/home-identity.js";
import { loadEngineRecord, writeEngineRecord } from "../state/engine-record.js";
import { describeEngine } from "../docker/engine-fingerprint.js";
import { EngineGuard, GuardedDockerClient } from "../runner/engine-guard.js";
import { checkEngineBinding, engineRecordOf, identifyEngine, recordedEngine } from "./engine-binding.js";
import { HomeWatch } from "../state/home-watch.js";
import { acquireHomeLock, type HomeLock } from "../state/home-lock.js";
import { StorageHealth } from "../state/storage-health.js";
import { TaskDirs } from "../state/task-dirs.js";
import { TaskStore } from "../tasks/task-store.js";
import { VERSION } from "../version.js";
import { shimHandoff } from "./connection-handoff.js";
import type { Logger } from "pino";
import { createLogger } from "./shim-logger.js";
import { prepareDcgm } from "./dcgm-setup.js";
import { startHeapTrim } from "./heap-trim.js";
import type { GlibcMalloc } from "./glibc-malloc.js";
import { inspectInheritedSocket, listenTarget, SocketActivationError } from "./listen-target.js";
import { SHUTDOWN_TIMINGS, ShutdownDeadline } from "../lifecycle/shutdown-deadline.js";
import { StartInterruptedError, unlessInterrupted } from "./start-interruption.js";
import { narrowLogFileMode } from "../state/log-file-sink.js";
import { errorMessage } from "../errors/error-message.js";
import { ShimLifecycle } from "../lifecycle/shim-lifecycle.js";

/** Startup could not complete; the message is one line for the operator. */
export class StartupError extends Error {
  override readonly name = "StartupError";
}

async function readBootId(path: string): Promise<string> {
  return (await readFile(path, "utf8").catch(() => "unknown")).trim();
}

async function readAuthToken(file: string): Promise<string | undefined> {
  if (file === "") return undefined;
  let token: string;
  try {
    // As sshd with its keys: a secret others may read is refused, with the fix named.
    const mode = (await stat(file)).mode;
    if ((mode & 0o077) !== 0) {
      throw new ConfigError(
        `the auth token file ${file} is accessible by group or others: chmod 600 ${file}`,
      );
    }
    token = (await readFile(file, "utf8")).trim();
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(`cannot read the auth token file ${file}: ${errorMessage(error)}`, {
      cause: error,
    });
  }
  if (token.length < 16 || /\s/.test(token)) {
    throw new ConfigError(`the auth token in ${file} must be at least 16 characters without whitespace`);
  }
  return token;
}

/**
 * Binds the API's address for a moment and lets it go: a taken port is found before anything
 * is restored (restoring first logged every finalized task ahead of the one line that matters).
 * Another process could take the port between this probe and the real listen; that rare race
 * still ends in the same one-line error, only later.
 */
export async function probeListen(host: string, port: number): Promise<void> {
  const server = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen({ host, port, exclusive: true }, resolve);
    });
  } catch (error) {
    throw listenError(error, host, port);
  }
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

function listenError(error: unknown, host: string, port: number): StartupError {
  const code = (error as NodeJS.ErrnoException).code;
  return new StartupError(
    code === "EADDRINUSE"
      ? `port ${port} on ${host} is already in use (choose another with --shim-http-port)`
      : code === "EADDRNOTAVAIL"
        ? `cannot listen on ${host}:${port}: the address is not on this host (see --shim-http-address)`
        : `cannot listen on ${host}:${port}: ${errorMessage(error)}`,
    { cause: error },
  );
}

/**
 * Writes service mode's `host_info.json` (dstack-shim's rules: once per start, only when absent).
 * Never fails the shim: a full or read-only home is reported by the storage health already, and
 * the log says what the server will miss.
 */
async function publishHostInfo(
  home: string,
  inventory: GpuInventory,
  facts: HostFacts,
  engine: EngineStorageRoot,
  log: Logger,
  signal: AbortSignal,
): Promise<void> {
  try {
    const { info, problems } = await collectHostInfo(inventory, facts, engine, signal);
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

/**
 * A running shim: `stopped` settles once it has shut down, by {@link SHUTDOWN_TIMINGS}' bound at
 * the latest; the caller then exits the process (a step left behind at the bound must not run on
 * after the home lock is released).
 */
export interface RunningShim {
  readonly address: string;
  readonly stopped: Promise<void>;
  /**
   * A graceful shutdown, as `POST /api/shutdown` and SIGINT/SIGTERM ask: one bounded path for all
   * (src/lifecycle/shutdown-deadline.ts). `force`, or a second request, interrupts the steps in flight
   * at once instead of after the grace.
   */
  shutdown(force: boolean): void;
}

/**
 * Starts the shim: lock the home, reach Docker, restore tasks, reconcile once, then serve.
 * Background jobs (reconcile loop, event stream, starts, installs) belong to the shim and are
 * cancelled and awaited on shutdown; containers are never touched by a shutdown.
 * `malloc`: the C heap's controls, where this host has them (`loadGlibcMalloc`), for the idle trim.
 * `interrupted`: aborted (with a `StartInterruptedError`) by a signal before the shim serves: the
 * start stops waiting at once, releases the home lock and throws that error (a clean stop).
 */
export async function startShim(
  config: ShimConfig,
  malloc?: GlibcMalloc,
  interrupted?: AbortSignal,
): Promise<RunningShim> {
  await mkdir(config.home, { recursive: true, mode: 0o755 });
  const authToken = await readAuthToken(config.authTokenFile);
  // Every cheap precondition before the home lock, the engine and the restore. A socket systemd
  // or the supervisor passes in is already bound: only an address of our own is probed.
  // A socket-activation error is a configuration error (SocketActivationError, exit 78): the unit
  // would hit it again at every restart.
  const target = listenTarget({ host: config.httpAddress, port: config.httpPort }, process.env, process.pid);
  if (target.kind === "address") await probeListen(target.host, target.port);
  else {
    const inherited = await inspectInheritedSocket(target.fd);
    if (inherited.kind === "refused") throw new SocketActivationError(inherited.why);
  }
  interrupted?.throwIfAborted();
  let lock: HomeLock;
  try {
    lock = await acquireHomeLock(config.home);
  } catch (error) {
    throw new StartupError(errorMessage(error), { cause: error });
  }
  // A log file made by an earlier version (0644) is narrowed too (never through a symlink).
  narrowLogFileMode(join(config.home, "shim.log"));
  const { log, logFile } = await createLogger(config);
  const lifecycle = new ShimLifecycle(log);
  try {
    armFailpoints(config.testing.failpoints);
  } catch (error) {
    await lock.release();
    throw new StartupError(errorMessage(error), { cause: error });
  }
  if (config.testing.failpoints) log.warn({ failpoints: config.testing.failpoints }, "failpoints armed");
  const shutdownController = new AbortController();
  const interruption = new AbortController();
  // Every Docker call and command in flight listens on these process-wide signals (and removes
  // its listener when it settles: deadline-signal.ts), so their count follows the work in flight,
  // e.g. 16 inspects at once in a restore: Node's leak heuristic of 10 does not apply to them.
  setMaxListeners(0, shutdownController.signal, interruption.signal);
  // A signal before the shim serves ends what is in flight (engine calls, commands) at once; the
  // start stops waiting for it (`unlessInterrupted`) and ends in the catch below.
  const onInterrupt = (): void => {
    shutdownController.abort(new Error("shim start interrupted"));
    interruption.abort(new Error("shim start interrupted"));
  };
  interrupted?.addEventListener("abort", onInterrupt, { once: true });
  if (interrupted?.aborted === true) onInterrupt();
  let stopHomeWatch = (): void => undefined;
  try {
    const store = new TaskStore();
    const metrics = new ShimMetrics(store, VERSION);
    metrics.setPhase(lifecycle.phase);
    lifecycle.onChange((view) => metrics.setPhase(view.phase));
    metrics.logLinesDropped.inc(logFile.state().droppedLines);
    logFile.onDropped = (lines) => metrics.logLinesDropped.inc(lines);
    const commands = new BoundedCommandRunner(interruption.signal);
    // Bound below, once the TaskRunner exists: what a degraded home could not take is written when
    // the probe finds it writable again.
    let catchUp: () => Promise<boolean> = () => Promise.resolve(true);
    const storage = new StorageHealth(join(config.home, "runners"), {
      log: (level, fields, msg) => log[level](fields, msg),
      observe: (up) => metrics.storageUp.set(up ? 1 : 0),
      catchUp: () => catchUp(),
    });
    // The engine's ping, GPU detection (vendor tools, when installed), the storage probe, the home
    // identity and the boot id do not depend on each other: a restart waits for the slowest only.
    const detecting = detectGpus(commands, {
      ...(config.gpuFixture ? { fixturePath: config.gpuFixture } : {}),
      log: (msg, fields) => log.warn(fields ?? {}, msg),
      installed: (tool) => onPath(tool),
    });
    detecting.catch(() => undefined); // awaited below; a ping failure must not leave it unhandled
    // The engine this home's containers live on, if it has any (a damaged record stops the start).
    const record = await loadEngineRecord(config.home).catch((error: unknown) => {
      throw new ConfigError(errorMessage(error), { cause: error });
    });
    // --engine-url, else DOCKER_HOST, else the home's engine, else Docker's socket or rootful
    // Podman's (one ping each at most).
    const endpoint = await chooseEngineEndpoint(
      { engineUrl: config.engineUrl, dockerHost: process.env.DOCKER_HOST, recordedUrl: record?.url },
      localEngineProbe((url) => DockerodeClient.fromUrl(url).ping(shutdownController.signal)),
    );
    const docker = DockerodeClient.fromUrl(endpoint.url, metrics.countEngineCall);
    // Which engine it is: detected once it answers, again whenever it is back after an outage.
    const engine = new EngineIdentity(docker, {
      log: (level, fields, msg) => log[level](fields, msg),
      changed: (info) => metrics.setEngine(info),
    });
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
          detecting,
          engine.detect(shutdownController.signal),
          identifyEngine(docker, shutdownController.signal).catch((error: unknown) => {
            throw new StartupError(`cannot identify the engine at ${endpoint.url}: ${errorMessage(error)}`, {
              cause: error,
            });
          }),
        ]);
        return { gpus, fingerprint };
      }),
      identified,
      readBootId(config.testing.bootIdFile),
      // A full or read-only home does not stop the start: it is reported (healthcheck, metric)
      // and probed until it takes writes again.
      storage.check(),
    ] as const;
    // All of them end before a failure is reported: none still writes into the home once the
    // failed start has released its lock.
    await unlessInterrupted(Promise.allSettled(steps), interrupted);
    const [{ gpus: inventory, fingerprint }, homeId, bootId] = await Promise.all(steps);
    metrics.setGpus(inventory);
    const binding = await checkEngineBinding({
      home: config.home,
      homeId,
      record,
      current: fingerprint,
      endpoint,
    });
    if (binding.kind === "moved") {
      log.warn(
        {
          from: binding.from.url,
          fromEngine: describeEngine(recordedEngine(binding.from)),
          to: endpoint.url,
        },
        "this home moved to another engine (--engine-url); the recorded one runs none of its containers",
      );
    }
    const engineGuard = new EngineGuard(
      docker,
      binding.kind === "unbound" ? undefined : fingerprint,
      (bound) => writeEngineRecord(config.home, engineRecordOf(bound, endpoint.url)),
      log,
    );
    const guarded = new GuardedDockerClient(docker, engineGuard);
    const params = containerParamsOf(config);
    const homeWatch = await HomeWatch.start(config.home, homeId, log);
    stopHomeWatch = () => homeWatch.stop();
    const ownership = new ContainerOwnership(homeId, config.adoptUnowned, log, (n) =>
      metrics.foreignContainers.set(n),
    );
    // DCGM on an NVIDIA host (PATH lookups only here; the exporter and health run once serving).
    const dcgm = await prepareDcgm({
      inventory,
      exporterPort: config.dcgmExporterHttpPort,
      exporterIntervalMs: config.dcgmExporterIntervalMs,
      dcgmAddress: config.dcgmAddress,
      home: config.home,
      commands,
      log,
    });
    const ctx: RunnerContext = {
      docker: guarded,
      engineGuard,
      store,
      dirs: new TaskDirs(config.home),
      inventory,
      gpuLock: new GpuLock(inventory),
      hostKeys: new HostKeysReconciler(
        new AuthorizedKeys(passwdUserLookup(config.testing.passwdFile), (msg, fields) =>
          log.warn(fields ?? {}, msg),
        ),
      ),
      volumes: new HostVolumes(commands, {
        mountRoot: config.volumeMountRoot,
        diskByIdDir: config.testing.diskByIdDir,
      }),
      params,
      ownership,
      bootId,
      log,
      shutdown: shutdownController.signal,
      observer: {
        ...metrics.observer,
        engineSeen: (up) => {
          metrics.observer.engineSeen(up);
          engine.seen(up, shutdownController.signal);
        },
      },
      storage,
    };
    const runner = new TaskRunner(ctx);
    catchUp = () => runner.catchUpStorage();
    const reconciler = new Reconciler(ctx, runner);
    const components = new ComponentService(
      { runner: config.runnerBinaryPath, shim: config.shimBinaryPath },
      commands,
      log,
      shutdownController.signal,
      { home: config.home, allowShimHandover: config.allowShimHandover },
    );
    let stopping: Promise<void> | undefined;
    let resolveStopped!: () => void;
    const stopped = new Promise<void>((resolve) => (resolveStopped = resolve));
    // Under `taskshim supervise`: kept-alive connections go to the next shim, not closed.
    const handoff = shimHandoff();
    const app = buildApi({
      version: VERSION,
      store: ctx.store,
      docker: guarded,
      runner,
      reconciler,
      inventory,
      components,
      log,
      metrics,
      storage,
      ...(authToken !== undefined ? { authToken } : {}),
      requestShutdown: (force) => shutdown(force),
      homeHealth: () => homeWatch.current(),
      ...(handoff ? { handoff } : {}),
      eventStreams: { maxStreams: config.maxEventStreams },
      engineInfo: () => engine.current(),
      engineBinding: () => engineGuard.state(),
      lifecycle: () => lifecycle.view,
      ...(dcgm.taskMetrics ? { taskMetrics: dcgm.taskMetrics } : {}),
      ...(dcgm.gpuHealth ? { gpuHealth: dcgm.gpuHealth } : {}),
    });
    // fastify compiles its routes and schemas (CPU) while the restore waits on the engine and the
    // disk; nothing listens before the restore and the first tick are done.
    const apiReady = (async () => void (await app.ready()))();
    apiReady.catch(() => undefined); // awaited below; a failed restore must not leave it unhandled
    // Restore, persist what it reconciled, the first tick, host keys (runner/recover.ts); the
    // cut starts resume once the API serves.
    lifecycle.to("restoring");
    const recovery = await unlessInterrupted(recover({ ctx, runner, reconciler }), interrupted);
    const report = recovery.report;
    // A home from before engine records, with tasks: bound now to the engine they were found on.
    if (engineGuard.state().state === "unbound" && store.list().length > 0) {
      await engineGuard.verify(shutdownController.signal).catch((error: unknown) => {
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

    const checked = components.refresh().then(() => {
      if (config.runnerDownloadUrl && !existsSync(config.runnerBinaryPath)) {
        components.install("dstack-runner", config.runnerDownloadUrl, undefined);
      }
    });

    await unlessInterrupted(apiReady, interrupted);
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
    const address =
      bound !== null && typeof bound === "object"
        ? `http://${bound.address}:${bound.port}`
        : `http://${config.httpAddress}:${config.httpPort}`;
    log.info(
      {
        address,
        home: config.home,
        engine: endpoint.url,
        engineFrom: endpoint.source,
        engineKind: engine.current()?.kind ?? "unknown",
        engineVersion: engine.current()?.version ?? "unknown",
        version: VERSION,
        node: process.version,
        tasks: report.restored,
        gpus: inventory.gpus.length,
        gpuVendor: inventory.vendor,
        homeId,
        mallocTrim: malloc !== undefined,
      },
      "taskshim serving",
    );
    lifecycle.to("serving");
    // From here a signal is a shutdown (`RunningShim.shutdown`), no longer an interrupted start.
    interrupted?.removeEventListener("abort", onInterrupt);

    const loop = reconciler.run();
    const events = config.testing.noEvents ? Promise.resolve() : reconciler.followEvents();
    const probing = storage.run(shutdownController.signal);
    const dcgmRunning = dcgm.start(shutdownController.signal);
    recovery.resumeStarts();
    const stopHeapTrim = startHeapTrim({ releaseMalloc: malloc?.trim });
    // Service mode: the API answers by the time the file appears (dstack's server reads it, then
    // asks the healthcheck at once).
    const hostInfo = config.serviceMode
      ? publishHostInfo(
          config.home,
          inventory,
          systemHostFacts(commands),
          docker,
          log,
          shutdownController.signal,
        )
      : Promise.resolve();

    let deadline: ShutdownDeadline | undefined;
    function shutdown(force: boolean): void {
      if (force) app.server.closeAllConnections();
      if (stopping) {
        // Asked again (a second signal, a forced request): no more grace.
        deadline?.interruptNow();
        return;
      }
      lifecycle.to("draining", { force });
      log.info(
        { force, graceMs: SHUTDOWN_TIMINGS.graceMs, boundMs: SHUTDOWN_TIMINGS.boundMs },
        "shutting down; containers keep running",
      );
      // One path for SIGTERM, SIGINT and POST /api/shutdown: the shutdown signal ends what can
      // resume cheaply at once (pulls, downloads, the loops); after the grace the interruption
      // kills the external commands in flight (their steps resume at the next start); at the bound
      // the process exits whatever is left.
      deadline = new ShutdownDeadline(SHUTDOWN_TIMINGS, () =>
        interruption.abort(new Error("interrupted by the shim's shutdown")),
      );
      if (force) deadline.interruptNow();
      const bounded = deadline;
      stopping = (async () => {
        shutdownController.abort(new Error("shim shutting down"));
        stopHeapTrim();
        runner.cancelPulls();
        // The API drains its open connections (up to DRAIN_TIMES) while the background jobs stop.
        const outcome = await bounded.wait({
          api: app.close(),
          reconcileLoop: loop,
          eventStream: events,
          storageProbe: probing,
          componentCheck: checked,
          starts: runner.awaitStarts(),
          installs: components.settle(),
          hostInfo,
          dcgm: dcgmRunning,
        });
        stopHomeWatch();
        await lock.release();
        if (outcome.kind === "deadline") {
          log.warn(
            { outcome: outcome.kind, elapsedMs: outcome.elapsedMs, unfinished: outcome.unfinished },
            "shutdown bound reached; exiting with steps unfinished (the next start resumes them)",
          );
        }
        log.info({ outcome: outcome.kind, elapsedMs: outcome.elapsedMs }, "shutdown complete");
        // Steps left behind at the bound are a shutdown that did not finish: failed, not stopped.
        lifecycle.to(outcome.kind === "deadline" ? "failed" : "stopped", { outcome: outcome.kind });
        log.flush();
        // Frees shim.log's descriptor; a line logged after this is still appended (LogFileSink.close).
        logFile.close();
        resolveStopped();
      })();
    }
    return { address, stopped, shutdown };
  } catch (error) {
    interrupted?.removeEventListener("abort", onInterrupt);
    // Interrupted by a signal (whatever the step in flight then threw): a clean stop.
    const stoppedBy = interrupted?.aborted === true ? (interrupted.reason as Error) : undefined;
    if (stoppedBy instanceof StartInterruptedError) {
      lifecycle.to("draining", { interruptedBy: stoppedBy.by });
      log.info(
        { by: stoppedBy.by },
        "start interrupted; stopping before serving (containers keep running, the next start restores)",
      );
    } else lifecycle.to("failed", { error: errorMessage(error) });
    shutdownController.abort();
    interruption.abort();
    stopHomeWatch();
    await lock.release();
    if (stoppedBy instanceof StartInterruptedError) lifecycle.to("stopped", { outcome: "interrupted" });
    log.flush();
    logFile.close();
    throw stoppedBy instanceof StartInterruptedError ? stoppedBy : error;
  }
}
