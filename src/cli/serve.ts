import { existsSync } from "node:fs";
import { mkdir, readFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { pino, type Logger } from "pino";
import { ShimMetrics } from "../api/metrics.js";
import { buildApi } from "../api/server.js";
import { ComponentService } from "../components/component-service.js";
import { ConfigError, containerParamsOf, type ShimConfig } from "../config/shim-config.js";
import { DockerodeClient } from "../docker/dockerode-client.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { AuthorizedKeys, HostKeysReconciler, passwdUserLookup } from "../host/authorized-keys.js";
import { detectGpus } from "../host/gpu-inventory.js";
import { GpuLock } from "../host/gpu-lock.js";
import { HostVolumes } from "../host/volumes.js";
import { armFailpoints } from "../runner/failpoints.js";
import { Reconciler } from "../runner/reconciler.js";
import { restoreTasks } from "../runner/restore.js";
import type { RunnerContext } from "../runner/runner-context.js";
import { TaskRunner } from "../runner/task-runner.js";
import { acquireHomeLock, type HomeLock } from "../state/home-lock.js";
import { TaskDirs } from "../state/task-dirs.js";
import { TaskStore } from "../tasks/task-store.js";
import { VERSION } from "../version.js";

/** Startup could not complete; the message is one line for the operator. */
export class StartupError extends Error {
  override readonly name = "StartupError";
}

/** Paths and fields that may carry secrets: never logged. */
const REDACT = [
  "registry_password",
  "*.registry_password",
  "password",
  "*.password",
  "req.headers.authorization",
];

function createLogger(config: ShimConfig): Logger {
  return pino(
    {
      level: config.logLevel,
      base: { pid: process.pid },
      // ISO 8601, readable by a person and by every log shipper (epoch ms are neither).
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: REDACT, censor: "[redacted]" },
    },
    pino.multistream([
      { level: config.logLevel, stream: process.stdout },
      {
        level: config.logLevel,
        stream: pino.destination({
          dest: join(config.home, "shim.log"),
          append: true,
          mkdir: true,
          sync: true,
        }),
      },
    ]),
  );
}

async function readBootId(path: string): Promise<string> {
  return (await readFile(path, "utf8").catch(() => "unknown")).trim();
}

async function readAuthToken(file: string): Promise<string | undefined> {
  if (file === "") return undefined;
  let token: string;
  try {
    token = (await readFile(file, "utf8")).trim();
  } catch (error) {
    throw new ConfigError(`cannot read the auth token file ${file}: ${(error as Error).message}`, {
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
        : `cannot listen on ${host}:${port}: ${(error as Error).message}`,
    { cause: error },
  );
}

/** A running shim: `stopped` settles once it has shut down. */
export interface RunningShim {
  readonly address: string;
  readonly stopped: Promise<void>;
  /** Graceful (or forced) shutdown, as `POST /api/shutdown` asks. */
  shutdown(force: boolean): void;
  /** SIGINT/SIGTERM: external commands in flight are killed, then a graceful shutdown. */
  interrupt(): void;
}

/**
 * Starts the shim: lock the home, reach Docker, restore tasks, reconcile once, then serve.
 * Background jobs (reconcile loop, event stream, starts, installs) belong to the shim and are
 * cancelled and awaited on shutdown; containers are never touched by a shutdown.
 */
export async function startShim(config: ShimConfig): Promise<RunningShim> {
  await mkdir(config.home, { recursive: true, mode: 0o755 });
  const authToken = await readAuthToken(config.authTokenFile);
  // Every cheap precondition before the home lock, the engine and the restore.
  await probeListen(config.httpAddress, config.httpPort);
  let lock: HomeLock;
  try {
    lock = await acquireHomeLock(config.home);
  } catch (error) {
    throw new StartupError((error as Error).message, { cause: error });
  }
  const log = createLogger(config);
  try {
    armFailpoints(config.testing.failpoints);
  } catch (error) {
    await lock.release();
    throw new StartupError((error as Error).message, { cause: error });
  }
  if (config.testing.failpoints) log.warn({ failpoints: config.testing.failpoints }, "failpoints armed");
  const shutdownController = new AbortController();
  const interruption = new AbortController();
  try {
    const store = new TaskStore();
    const metrics = new ShimMetrics(store, VERSION);
    const docker = DockerodeClient.fromEnv(process.env.DOCKER_HOST, metrics.countEngineCall);
    try {
      await docker.ping();
    } catch (error) {
      throw new StartupError(
        `docker engine unreachable (${process.env.DOCKER_HOST ?? "unix:///var/run/docker.sock"}): ${(error as Error).message}`,
        { cause: error },
      );
    }
    const commands = new BoundedCommandRunner(interruption.signal);
    const inventory = await detectGpus(commands, {
      ...(config.gpuFixture ? { fixturePath: config.gpuFixture } : {}),
      log: (msg, fields) => log.warn(fields ?? {}, msg),
    });
    const params = containerParamsOf(config);
    const ctx: RunnerContext = {
      docker,
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
      bootId: await readBootId(config.testing.bootIdFile),
      log,
      shutdown: shutdownController.signal,
      observer: metrics.observer,
    };
    const runner = new TaskRunner(ctx);
    const reconciler = new Reconciler(ctx, runner);
    const report = await restoreTasks(ctx);
    // What the restore reconciled (a start cut after its container started) is made durable now,
    // or a container that vanishes before the next change would send the task back to `creating`.
    for (const id of report.changed) await runner.persister.persist(id);
    metrics.restoredTasks.set(report.restored);
    metrics.quarantined.set({ kind: "corrupt" }, report.quarantined.length);
    metrics.quarantined.set({ kind: "newer-format" }, report.skippedNewer.length);

    // Exits that happened while the shim was down are final before the first request.
    await reconciler.tick();
    // After the tick: tasks that ended while the shim was down no longer claim their keys.
    await runner.reconcileHostKeys().catch((error: unknown) => {
      log.error({ err: error }, "host keys reconcile at startup failed");
    });

    const components = new ComponentService(
      { runner: config.runnerBinaryPath, shim: config.shimBinaryPath },
      commands,
      log,
      shutdownController.signal,
    );
    const checked = components.refresh().then(() => {
      if (config.runnerDownloadUrl && !existsSync(config.runnerBinaryPath)) {
        components.install("dstack-runner", config.runnerDownloadUrl, undefined);
      }
    });

    let stopping: Promise<void> | undefined;
    let resolveStopped!: () => void;
    const stopped = new Promise<void>((resolve) => (resolveStopped = resolve));
    const app = buildApi({
      version: VERSION,
      store: ctx.store,
      docker,
      runner,
      reconciler,
      inventory,
      components,
      log,
      metrics,
      ...(authToken !== undefined ? { authToken } : {}),
      requestShutdown: (force) => shutdown(force),
    });
    try {
      await app.listen({ host: config.httpAddress, port: config.httpPort });
    } catch (error) {
      throw listenError(error, config.httpAddress, config.httpPort);
    }
    const address = `http://${config.httpAddress}:${config.httpPort}`;
    log.info(
      {
        address,
        home: config.home,
        engine: process.env.DOCKER_HOST ?? "unix:///var/run/docker.sock",
        version: VERSION,
        node: process.version,
        tasks: report.restored,
        gpus: inventory.gpus.length,
      },
      "taskshim serving",
    );

    const loop = reconciler.run();
    const events = config.testing.noEvents ? Promise.resolve() : reconciler.followEvents();
    for (const id of report.resumed) runner.startInBackground(id);

    function shutdown(force: boolean): void {
      if (force) app.server.closeAllConnections();
      if (stopping) return;
      log.info({ force }, "shutting down; containers keep running");
      stopping = (async () => {
        shutdownController.abort(new Error("shim shutting down"));
        runner.cancelPulls();
        await app.close();
        await Promise.allSettled([loop, events, checked, runner.awaitStarts(), components.settle()]);
        await lock.release();
        log.info("shutdown complete");
        log.flush();
        resolveStopped();
      })();
    }
    return {
      address,
      stopped,
      shutdown,
      interrupt: () => {
        interruption.abort(new Error("interrupted"));
        shutdown(false);
      },
    };
  } catch (error) {
    shutdownController.abort();
    await lock.release();
    log.flush();
    throw error;
  }
}
