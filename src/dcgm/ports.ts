/*
 * What the rest of the shim sees of DCGM: two ports. The HTTP edge reads a task's GPU metrics
 * through TaskMetricsSource and the GPU health through GpuHealthView; shim/dcgm-setup.ts builds the
 * real adapters (exporter-supervisor.ts, health-monitor.ts over dcgmi-health.ts) and the tests
 * drive fakes. The health shape is dstack-shim's (runner/internal/shim/dcgm/wrapper.go, Health
 * and HealthIncident), which dstack's server reads as DCGMHealthResponse.
 */

/** DCGM's health results (`dcgmHealthWatchResult_enum`): pass, warn, fail. dstack's server refuses any other. */
export type DcgmHealthResult = 0 | 10 | 20;

/** DCGM's result values by name. */
export const DCGM_HEALTH = { pass: 0, warn: 10, fail: 20 } as const satisfies Record<
  string,
  DcgmHealthResult
>;

/** One incident of a health check, flattened as dstack-shim sends it. */
export interface DcgmHealthIncident {
  /** The health watch system (`DCGM_HEALTH_WATCH_*` bit: 0x1 PCIe, 0x10 memory…). */
  readonly system: number;
  readonly health: DcgmHealthResult;
  readonly error_message: string;
  /** DCGM's error code; 0 when the source does not report it. */
  readonly error_code: number;
  /** DCGM's entity group (1: GPU, 3: NvSwitch…). */
  readonly entity_group_id: number;
  readonly entity_id: number;
}

/** `GET /api/instance/health`'s `dcgm`: the overall result and its incidents. */
export interface DcgmHealth {
  readonly overall_health: DcgmHealthResult;
  readonly incidents: readonly DcgmHealthIncident[];
}

/** A source of GPU health: asked in the background, never on a request's path. */
export interface GpuHealthSource {
  /** Human name for logs (`dcgmi`, `fake`). */
  readonly name: string;
  /**
   * One health check. Rejects when DCGM cannot answer; must settle soon after `signal` aborts
   * (the monitor's deadline or the shim's shutdown).
   */
  check(signal: AbortSignal): Promise<DcgmHealth>;
}

/** What the instance-health route reads: the last answer, at once. */
export interface GpuHealthView {
  /** The last health check while it is fresh; null without one (no DCGM, an error, too old). */
  current(): DcgmHealth | null;
}

/** The exporter's answer could not be fetched (HTTP 502, as dstack-shim). */
export class MetricsFetchError extends Error {
  override readonly name = "MetricsFetchError";
}

/** No exporter runs, nor will (it failed its version check): HTTP 404, as without one. */
export class ExporterUnavailableError extends Error {
  override readonly name = "ExporterUnavailableError";
}

/** Where a task's GPU metrics come from: DCGM Exporter's whole answer, filtered by the caller. */
export interface TaskMetricsSource {
  /**
   * DCGM Exporter's `/metrics` text (Prometheus text format 0.0.4), at most one collect
   * interval old.
   *
   * @throws ExporterUnavailableError when no exporter will run.
   * @throws MetricsFetchError when the exporter is not serving or its answer failed.
   */
  exposition(signal: AbortSignal): Promise<string>;
}
