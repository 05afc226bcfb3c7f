import type { EngineBindingState } from "../runner/engine-guard.js";
import type { Logger } from "pino";
import type { ComponentService } from "../components/component-service.js";
import type { GpuHealthView, TaskMetricsSource } from "../dcgm/ports.js";
import type { DockerClient } from "../docker/docker-client.js";
import type { EngineInfo } from "../docker/engine-info.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import type { ShimPhaseView } from "../lifecycle/shim-lifecycle.js";
import type { Reconciler } from "../runner/reconciler.js";
import type { TaskRunner } from "../runner/task-runner.js";
import type { HomeHealth } from "../state/home-watch.js";
import type { StorageHealth } from "../state/storage-health.js";
import type { TaskStore } from "../tasks/task-store.js";
import type { BuildIdentity } from "../version.js";
import type { ConnectionHandoff, DrainTimes } from "./connection-drain.js";
import type { EventStreamLimits } from "./event-streams.js";
import type { ShimMetrics } from "./metrics.js";

/** What the HTTP edge needs from the rest of the shim. */
export interface ApiDeps {
  readonly version: string;
  readonly store: TaskStore;
  /** Used only for the logs extension; every other read is answered from memory. */
  readonly docker: DockerClient;
  readonly runner: TaskRunner;
  readonly reconciler: Reconciler;
  readonly inventory: GpuInventory;
  readonly components: ComponentService;
  readonly log: Logger;
  readonly metrics: ShimMetrics;
  /** The healthcheck's `build` (commit, dirty, build id); absent: this process's, `BUILD`. */
  readonly build?: BuildIdentity;
  /** Which engine the shim drives (the healthcheck's `engine.kind` and `version`), once known. */
  readonly engineInfo?: () => EngineInfo | undefined;
  /** The home's engine binding (runner/engine-guard.ts): a mismatch is the healthcheck's engine status. */
  readonly engineBinding?: () => EngineBindingState;
  /** The shim process's phase (the healthcheck's `lifecycle`); absent: not reported. */
  readonly lifecycle?: () => ShimPhaseView;
  /** The home's storage health (the healthcheck's `storage`); absent: reported ok. */
  readonly storage?: StorageHealth;
  /** When set, every route but the healthcheck needs `Authorization: Bearer <token>`. */
  readonly authToken?: string;
  /** Starts a graceful (or forced) shutdown; the process exits 0 once it is done. */
  requestShutdown(force: boolean): void;
  /** Whether the home is still the one the shim started on (the `home` healthcheck field). */
  readonly homeHealth?: () => HomeHealth;
  /** How long `close()` keeps open connections to answer what arrives on them (default DRAIN_TIMES). */
  readonly drainTimes?: DrainTimes;
  /** Where idle connections go when the server drains, instead of being closed (the next shim). */
  readonly handoff?: ConnectionHandoff;
  /** DCGM Exporter's answer for `GET /metrics/tasks/{id}`; absent: no exporter runs (404). */
  readonly taskMetrics?: TaskMetricsSource;
  /** GPU health for `GET /api/instance/health`; absent: no source (`{"dcgm": null}`). */
  readonly gpuHealth?: GpuHealthView;
  /** Bounds of `GET /api/events` (default EVENT_STREAM_LIMITS; `--max-event-streams`). */
  readonly eventStreams?: Partial<EventStreamLimits>;
}
