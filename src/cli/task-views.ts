import type { Healthcheck, ShimComponent, ShimTaskInfo } from "../control/shim-client.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { formatBytes } from "./sizes.js";
import { cell, formatFields, formatTable } from "./table.js";

/** Columns of `taskshim tasks ls`. */
export const TASK_TABLE_HEADER = ["ID", "STATUS", "REASON", "CONTAINER", "GPUS", "PORTS"] as const;

/** Port bindings as `host->container`, comma separated; `-` when there are none. */
export function formatPorts(ports: ShimTaskInfo["ports"]): string {
  return ports && ports.length > 0 ? ports.map((p) => `${p.host}->${p.container}`).join(", ") : "-";
}

/** The task table of `tasks ls`. */
export function formatTaskTable(tasks: readonly ShimTaskInfo[]): string {
  return formatTable(
    TASK_TABLE_HEADER,
    tasks.map((t) => [
      cell(t.id),
      t.status,
      cell(t.termination_reason),
      cell(t.container_name),
      t.gpus_ids && t.gpus_ids.length > 0 ? String(t.gpus_ids.length) : "-",
      cell(formatPorts(t.ports)),
    ]),
  );
}

/** The pull numbers of a task, `-` before any layer was seen. */
export function formatPullProgress(progress: ShimTaskInfo["image_pull_progress"]): string {
  if (!progress) return "-";
  const total = `${formatBytes(progress.total_bytes)}${progress.is_total_bytes_final ? "" : "+"}`;
  return `${formatBytes(progress.downloaded_bytes)} / ${total} downloaded, ${formatBytes(progress.extracted_bytes)} extracted`;
}

/** Every field of one task, for `tasks get`. */
export function formatTaskDetails(task: ShimTaskInfo): string {
  const container = task.container_name
    ? `${task.container_name}${task.container_id ? ` (${task.container_id.slice(0, 12)})` : ""}`
    : "-";
  return formatFields([
    ["id", task.id],
    ["status", task.status],
    ["reason", task.termination_reason || "-"],
    ["message", task.termination_message || "-"],
    ["container", container],
    ["gpus", task.gpus_ids && task.gpus_ids.length > 0 ? task.gpus_ids.join(", ") : "-"],
    ["ports", formatPorts(task.ports)],
    ["pull", formatPullProgress(task.image_pull_progress)],
  ]);
}

/** Everything `taskshim status` reports; also its `--json` shape. */
export interface ShimStatusReport {
  readonly shim: string;
  readonly service: string;
  readonly version: string;
  /** `taskshim` for taskshim; null for a shim that does not say (dstack-shim). */
  readonly implementation: string | null;
  /** The engine as the shim's reconciler last saw it; null when the shim does not report it. */
  readonly engine: NonNullable<Healthcheck["engine"]> | null;
  /** Whether the shim's home takes durable writes; absent when the shim does not report it. */
  readonly storage?: NonNullable<Healthcheck["storage"]>;
  readonly gpu: {
    readonly vendor: string | null;
    readonly driver_version: string | null;
    /** Distinct GPUs held by tasks that are not terminated. */
    readonly in_use: number;
  };
  /** null when the shim has no components API. */
  readonly components: readonly ShimComponent[] | null;
  readonly tasks: { readonly total: number; readonly by_status: Readonly<Record<TaskStatus, number>> };
  /** From `/metrics`; null when the shim does not export it. */
  readonly quarantined_state_files: Readonly<Record<string, number>> | null;
}

/** Counts tasks by status, every status present (0 when none). */
export function countByStatus(tasks: readonly { readonly status: TaskStatus }[]): Record<TaskStatus, number> {
  const counts = Object.fromEntries(TASK_STATUSES.map((s) => [s, 0])) as Record<TaskStatus, number>;
  for (const task of tasks) counts[task.status] += 1;
  return counts;
}

/**
 * Reads `taskshim_quarantined_state_files{kind="…"} N` from a Prometheus exposition; undefined
 * when the metric is absent (another shim, or an older taskshim).
 */
export function parseQuarantined(metrics: string): Record<string, number> | undefined {
  const found: Record<string, number> = {};
  let any = false;
  for (const match of metrics.matchAll(
    /^taskshim_quarantined_state_files\{kind="([^"]*)"\}\s+([0-9.eE+-]+)\s*$/gm,
  )) {
    const [, kind, value] = match;
    if (kind === undefined || value === undefined) continue;
    found[kind] = Number(value);
    any = true;
  }
  return any ? found : undefined;
}

/** `degraded since <time> (<error>)`: a health object of the healthcheck, on one line. */
function healthLine(health: { status: string; since?: string; error?: string }): string {
  return [health.status, health.since ? `since ${health.since}` : "", health.error ? `(${health.error})` : ""]
    .filter(Boolean)
    .join(" ");
}

/** The human view of `taskshim status`. */
export function formatStatusReport(report: ShimStatusReport): string {
  const engine = report.engine
    ? [
        report.engine.status,
        report.engine.since ? `since ${report.engine.since}` : "",
        report.engine.error ? `(${report.engine.error})` : "",
      ]
        .filter(Boolean)
        .join(" ")
    : "not reported by this shim";
  const gpus = report.gpu.vendor
    ? `${report.gpu.vendor}${report.gpu.driver_version ? `, driver ${report.gpu.driver_version}` : ""}, ${report.gpu.in_use} in use`
    : "none";
  const components = report.components
    ? report.components.map((c) => `${c.name} ${c.status}${c.version ? ` (${c.version})` : ""}`).join(", ")
    : "not supported by this shim";
  const counts = TASK_STATUSES.filter((s) => report.tasks.by_status[s] > 0)
    .map((s) => `${report.tasks.by_status[s]} ${s}`)
    .join(", ");
  const quarantined = report.quarantined_state_files
    ? Object.entries(report.quarantined_state_files)
        .filter(([, n]) => n > 0)
        .map(([kind, n]) => `${n} ${kind}`)
        .join(", ") || "none"
    : "-";
  return formatFields([
    ["shim", report.shim],
    ["version", `${report.version}${report.implementation ? ` (${report.implementation})` : ""}`],
    ["engine", engine],
    ...(report.storage ? [["storage", healthLine(report.storage)] as [string, string]] : []),
    ["gpus", gpus],
    ["components", components],
    ["tasks", `${report.tasks.total}${counts ? ` (${counts})` : ""}`],
    ["quarantined", quarantined],
  ]);
}
