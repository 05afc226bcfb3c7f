/*
 * The start of the shim, as the sequence of docs/architecture.md's "Startup": each numbered step
 * is a function of startup-checks.ts or startup-steps.ts, the parts between them are built by
 * compose.ts, and the shutdown (shutdown.ts) drives the lifecycle from the log's opening on.
 */
import type { ShimConfig } from "../config/shim-config.js";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import { VERSION } from "../version.js";
import { composeApi, composeBase, composeRunner } from "./compose.js";
import { prepareDcgm } from "./dcgm-setup.js";
import type { GlibcMalloc } from "./glibc-malloc.js";
import { ShimShutdown } from "./shutdown.js";
import { unlessInterrupted } from "./start-interruption.js";
import { checkPreconditions, lockHome, openLog } from "./startup-checks.js";
import {
  bindEngine,
  checkComponents,
  chooseEngine,
  listen,
  reachEngine,
  recoverTasks,
  runInBackground,
  surveyHost,
} from "./startup-steps.js";

export { StartupError } from "./startup-checks.js";

/**
 * A running shim: `stopped` settles once it has shut down, by the shutdown deadline's bound at
 * the latest; the caller then exits the process (a step left behind at the bound must not run on
 * after the home lock is released).
 */
export interface RunningShim {
  readonly address: string;
  readonly stopped: Promise<void>;
  /**
   * A graceful shutdown, as `POST /api/shutdown` and SIGINT/SIGTERM ask: one bounded path for all
   * (src/shim/shutdown.ts). `force`, or a second request, interrupts the steps in flight at once
   * instead of after the grace.
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
  const { authToken, target } = await checkPreconditions(config, interrupted); // 1
  const lock = await lockHome(config.home); // 2
  const { log, logFile } = await openLog(config, lock); // 3
  const shutdown = new ShimShutdown({ log, lock, logFile });
  shutdown.watchStart(interrupted);
  let scan: Promise<ScannedTaskDir[]> | undefined;
  try {
    const base = composeBase(config, log, logFile, shutdown);
    scan = base.dirs.scan(); // 6's reads of the task dirs, begun under the lock while 4 and 5 wait
    scan.catch(() => undefined); // awaited by the recovery, or below on a failed start
    const host = surveyHost(config, base.commands, base.storage, log); // 5, begun before 4
    const chosen = await chooseEngine(config, base.metrics, log, shutdown.signal); // 4
    const reached = await reachEngine(config, chosen, host, shutdown.signal, interrupted); // 4 and 5
    base.metrics.setGpus(reached.inventory);
    const { engineGuard, homeWatch } = await bindEngine(config, chosen, reached, log, shutdown); // 4
    const found = { ...reached, engineGuard };
    const running = composeRunner(config, base, found, log, shutdown);
    // 6's list, begun now that the engine is bound: its round trip hides behind DCGM's lookups
    // and the API's building.
    const listing = running.ctx.docker.listTaskContainers(shutdown.signal);
    listing.catch(() => undefined); // awaited by the recovery; a failed start must not leave it unhandled
    // DCGM on an NVIDIA host (PATH lookups only here; the exporter and health run once serving).
    const dcgm = await prepareDcgm({
      inventory: found.inventory,
      exporterPort: config.dcgmExporterHttpPort,
      exporterIntervalMs: config.dcgmExporterIntervalMs,
      dcgmAddress: config.dcgmAddress,
      home: config.home,
      commands: base.commands,
      log,
    });
    const parts = { ...base, ...running, homeWatch, dcgm };
    const api = composeApi(config, parts, found, authToken, log, shutdown);
    // fastify compiles its routes and schemas (CPU) while the restore waits on the engine and the
    // disk; nothing listens before the restore and the first tick are done.
    const ready = (async () => void (await api.app.ready()))();
    ready.catch(() => undefined); // awaited by listen; a failed restore must not leave it unhandled
    const begun = { scanning: scan, listing };
    const recovery = await recoverTasks(parts, engineGuard, begun, log, shutdown, interrupted); // 6
    const componentCheck = checkComponents(config, parts.components); // 7
    const address = await listen(config, api, ready, target, interrupted); // 8
    const engine = chosen.engine.current();
    log.info(
      {
        address,
        home: config.home,
        engine: chosen.endpoint.url,
        engineFrom: chosen.endpoint.source,
        engineKind: engine?.kind ?? "unknown",
        engineVersion: engine?.version ?? "unknown",
        version: VERSION,
        node: process.version,
        tasks: recovery.report.restored,
        gpus: found.inventory.gpus.length,
        gpuVendor: found.inventory.vendor,
        homeId: found.homeId,
        mallocTrim: malloc !== undefined,
      },
      "taskshim serving",
    );
    shutdown.serving();
    const background = { ...parts, app: api.app };
    shutdown.drains(
      runInBackground(config, background, found, recovery, componentCheck, malloc, log, shutdown.signal),
    );
    return { address, stopped: shutdown.stopped, shutdown: (force) => shutdown.request(force) };
  } catch (error) {
    // The scan deletes stale temp files in the home: it ends before the lock is released, unless
    // a signal stops the start (as the recovery's own reads would).
    if (scan !== undefined) await unlessInterrupted(scan, interrupted).catch(() => undefined);
    throw await shutdown.failStart(error);
  }
}
