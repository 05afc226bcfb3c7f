import type { EngineBindingState } from "../runner/engine-guard.js";
import type { EngineInfo } from "../docker/engine-info.js";
import type { Reconciler } from "../runner/reconciler.js";
import type { HomeHealth } from "../state/home-watch.js";
import type { StorageHealth } from "../state/storage-health.js";
import { readRollbackReport } from "../lifecycle/rollback-report.js";
import { BUILD } from "../version.js";
import { Healthcheck, InstanceHealth, InstanceInfo, ShutdownBody } from "../wire/schemas.js";
import type { ApiDeps } from "./api-deps.js";
import type { ApiRoute } from "./openapi.js";
import { readBody, sendText } from "./replies.js";

/** The shim itself: `GET /api/healthcheck` and `POST /api/shutdown`. */
export function healthRoutes(deps: ApiDeps): ApiRoute[] {
  const startedAt = Date.now();
  const build = deps.build ?? BUILD;
  const buildView = { commit: build.commit, dirty: build.dirty, build_id: build.buildId };
  // Set by the supervisor when it started this process after a rollback: fixed for its life.
  const rollback = readRollbackReport(process.env);
  return [
    {
      method: "GET",
      url: "/api/healthcheck",
      summary: "Service name and version (drives dstack's feature gates); never needs a token",
      public: true,
      response: Healthcheck,
      // `implementation`, `engine`, `storage`, `build` and `lifecycle` are taskshim extensions; dstack's client
      // ignores them. `version` stays a plain semver: dstack parses it into a tuple.
      handler: () => ({
        service: "dstack-shim",
        version: deps.version,
        implementation: "taskshim",
        engine: engineView(deps.reconciler, deps.engineInfo?.(), deps.engineBinding?.()),
        storage: storageView(deps.storage, startedAt, deps.homeHealth?.()),
        build: buildView,
        ...(deps.lifecycle ? { lifecycle: deps.lifecycle() } : {}),
        ...(rollback ? { rollback } : {}),
      }),
    },
    {
      method: "POST",
      url: "/api/shutdown",
      summary: "Graceful (or forced) shutdown; the process exits 0 and containers keep running",
      body: ShutdownBody,
      handler: (request, reply) => {
        const b = readBody(request, ShutdownBody);
        deps.requestShutdown(b.force === true);
        // Its connection is not kept: the drain would otherwise hold it open, idle, for its grace.
        return sendText(reply.header("connection", "close"), 200, "");
      },
    },
  ];
}

/** The host: `GET /api/instance/health` and `GET /api/instance/info`. */
export function instanceRoutes(deps: ApiDeps): ApiRoute[] {
  return [
    {
      method: "GET",
      url: "/api/instance/health",
      summary: "GPU health from DCGM (null: no DCGM, or no fresh answer from it)",
      response: InstanceHealth,
      // From memory: the health is asked in the background (dcgm/health-monitor.ts), never here.
      handler: () => ({ dcgm: deps.gpuHealth?.current() ?? null }),
    },
    {
      method: "GET",
      url: "/api/instance/info",
      summary: "GPU vendor and driver of the host ({} without GPUs)",
      response: InstanceInfo,
      handler: () => {
        const first = deps.inventory.gpus[0];
        return first ? { gpu_vendor: first.vendor, gpu_driver_version: first.driverVersion } : {};
      },
    },
  ];
}

/**
 * The healthcheck's `engine`: its health as the reconciler last saw it, and which engine it is
 * (`kind`, `version`) once detected. The name stays through an outage: it is the engine the shim
 * last spoke to, detected again when the engine is back.
 */
function engineView(
  reconciler: Reconciler,
  info: EngineInfo | undefined,
  binding?: EngineBindingState,
): { status: string; since?: string; error?: string; kind?: string; version?: string } {
  const named = info ? { kind: info.kind, version: info.version } : {};
  // Up or not, an engine that is not this home's is the one thing that matters.
  if (binding?.state === "mismatch") {
    return { status: "mismatch", since: new Date(binding.since).toISOString(), error: binding.why, ...named };
  }
  const health = reconciler.engineHealth();
  switch (health.state) {
    case "unknown":
      return { status: "unknown", ...named };
    case "up":
      return { status: "up", since: new Date(health.since).toISOString(), ...named };
    case "down":
      return { status: "down", since: new Date(health.since).toISOString(), error: health.error, ...named };
  }
}

/**
 * The healthcheck's `storage`: degraded while durable writes fail, and also while the home the
 * shim started on is deleted or replaced (what it writes then is lost to a restart).
 */
function storageView(
  storage: StorageHealth | undefined,
  startedAt: number,
  home: HomeHealth | undefined,
): { status: "ok" | "degraded"; since: string; error?: string } {
  const health =
    home?.status === "degraded"
      ? { state: "degraded" as const, since: home.since, error: home.error }
      : (storage?.state() ?? { state: "ok" as const, since: startedAt });
  return health.state === "ok"
    ? { status: "ok", since: new Date(health.since).toISOString() }
    : { status: "degraded", since: new Date(health.since).toISOString(), error: health.error };
}
