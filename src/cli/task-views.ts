import type { Healthcheck, ShimComponent, ShimTaskInfo } from "../control/shim-client.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { formatBytes } from "./sizes.js";
import { cell, formatFields, formatTable } from "./table.js";

/** Columns of `taskshim tasks ls` (docker ps's, with NAME and IMAGE as a task has them). */
export const TASK_TABLE_HEADER = ["ID", "NAME", "IMAGE", "STATUS", "CREATED"] as const;

/** How many characters of an id `tasks ls` shows (docker's 12); any unique prefix works as an id. */
export const SHORT_ID_LENGTH = 12;

/** Port bindings as `host->container`, comma separated; `-` when there are none. */
export function formatPorts(ports: ShimTaskInfo["ports"]): string {
  return ports && ports.length > 0 ? ports.map((p) => `${p.host}->${p.container}`).join(", ") : "-";
}

const UNITS: readonly (readonly [number, string])[] = [
  [365 * 86_400_000, "year"],
  [30 * 86_400_000, "month"],
  [7 * 86_400_000, "week"],
  [86_400_000, "day"],
  [3_600_000, "hour"],
  [60_000, "minute"],
  [1_000, "second"],
];

/**
 * Docker's human duration (go-units HumanDuration, simplified): `Less than a second`,
 * `5 seconds`, `About a minute`, `5 minutes`, `About an hour`, `3 hours`, `2 days`…
 */
export function humanDuration(ms: number): string {
  const seconds = Math.floor(ms / 1_000);
  if (seconds < 1) return "Less than a second";
  if (seconds === 1) return "1 second";
  if (seconds < 60) return `${seconds} seconds`;
  const minutes = Math.floor(seconds / 60);
  if (minutes === 1) return "About a minute";
  if (minutes < 60) return `${minutes} minutes`;
  const hours = Math.round(minutes / 60);
  if (hours === 1) return "About an hour";
  if (hours < 48) return `${hours} hours`;
  for (const [unit, name] of UNITS) {
    const n = Math.floor(ms / unit);
    if (n >= 2 && unit >= 86_400_000) return `${n} ${name}s`;
  }
  return `${hours} hours`;
}

/*
 * `now` is wall clock on purpose throughout this file: it is compared with the shim's
 * `created_at`/`started_at`/`finished_at`, which are wall-clock timestamps.
 */
const since = (iso: string | null | undefined, now: number): string | undefined => {
  const at = iso ? Date.parse(iso) : Number.NaN;
  return Number.isFinite(at) ? humanDuration(Math.max(0, now - at)) : undefined;
};

/**
 * A task's status as `docker ps` writes a container's: `Up 5 minutes`, `Exited (3) 2 minutes
 * ago`, and for the statuses a container does not have, `Pulling 45%`, `Creating`, `Pending`.
 */
export function dockerStyleStatus(task: ShimTaskInfo, now: number = Date.now()): string {
  switch (task.status) {
    case "running": {
      const up = since(task.started_at, now);
      return up ? `Up ${up}` : "Up";
    }
    case "terminated": {
      // A task that never had a container (or lost it) has no exit code to show.
      const known = task.exit_code !== null && task.exit_code !== undefined;
      const ago = since(task.finished_at, now);
      return `${known ? `Exited (${task.exit_code})` : "Terminated"}${ago ? ` ${ago} ago` : ""}`;
    }
    case "pulling": {
      const percent = pullPercent(task.image_pull_progress);
      return percent === undefined ? "Pulling" : `Pulling ${percent}%`;
    }
    case "pending":
      return "Pending";
    case "preparing":
      return "Preparing";
    case "creating":
      return "Creating";
  }
}

/**
 * The pull's completion over download and extraction together (each byte counts once
 * downloaded and once extracted); undefined while no layer size is known.
 */
export function pullPercent(progress: ShimTaskInfo["image_pull_progress"]): number | undefined {
  if (!progress || progress.total_bytes <= 0) return undefined;
  const done =
    Math.min(progress.downloaded_bytes, progress.total_bytes) +
    Math.min(progress.extracted_bytes, progress.total_bytes);
  return Math.min(100, Math.floor((done / (2 * progress.total_bytes)) * 100));
}

/** Newest first, as `docker ps`; tasks without a creation time (restored from a container alone) last. */
export function newestFirst(tasks: readonly ShimTaskInfo[]): ShimTaskInfo[] {
  const created = (t: ShimTaskInfo): number =>
    t.created_at ? Date.parse(t.created_at) : Number.NEGATIVE_INFINITY;
  return [...tasks].sort((a, b) => created(b) - created(a) || a.id.localeCompare(b.id));
}

/** The task table of `tasks ls`, newest first. */
export function formatTaskTable(tasks: readonly ShimTaskInfo[], now: number = Date.now()): string {
  return formatTable(
    TASK_TABLE_HEADER,
    newestFirst(tasks).map((t) => [
      cell(t.id.slice(0, SHORT_ID_LENGTH)),
      cell(t.name ?? t.container_name, 40),
      cell(t.image_name, 50),
      cell(dockerStyleStatus(t, now), 60),
      t.created_at ? `${since(t.created_at, now) ?? "?"} ago` : "-",
    ]),
  );
}

/** The pull numbers of a task, `-` before any layer was seen. */
export function formatPullProgress(progress: ShimTaskInfo["image_pull_progress"]): string {
  if (!progress) return "-";
  const total = `${formatBytes(progress.total_bytes)}${progress.is_total_bytes_final ? "" : "+"}`;
  return `${formatBytes(progress.downloaded_bytes)} / ${total} downloaded, ${formatBytes(progress.extracted_bytes)} extracted`;
}

const time = (iso: string | null | undefined, now: number): string => {
  const ago = since(iso, now);
  return iso && ago ? `${iso} (${ago} ago)` : "-";
};

/** Every field of one task, for `tasks get`. */
export function formatTaskDetails(task: ShimTaskInfo, now: number = Date.now()): string {
  const container = task.container_name
    ? `${task.container_name}${task.container_id ? ` (${task.container_id.slice(0, 12)})` : ""}`
    : "-";
  return formatFields([
    ["id", task.id],
    ["name", task.name ?? "-"],
    ["image", task.image_name ?? "-"],
    ["status", `${task.status} (${dockerStyleStatus(task, now)})`],
    ["exit code", task.exit_code === null || task.exit_code === undefined ? "-" : String(task.exit_code)],
    ["reason", task.termination_reason || "-"],
    ["message", task.termination_message || "-"],
    ["created", time(task.created_at, now)],
    ["started", time(task.started_at, now)],
    ["finished", time(task.finished_at, now)],
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
  /** The shim process's lifecycle phase; absent when the shim does not report it. */
  readonly lifecycle?: NonNullable<Healthcheck["lifecycle"]>;
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
  // `podman 4.3.1, up since …`; a shim that does not name its engine shows its health alone.
  const named = report.engine?.kind
    ? `${report.engine.kind} ${report.engine.version ?? ""}`.trim() + ", "
    : "";
  const engine = report.engine
    ? [
        named + report.engine.status,
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
    ...(report.lifecycle
      ? [["phase", `${report.lifecycle.phase} since ${report.lifecycle.since}`] as [string, string]]
      : []),
    ["engine", engine],
    ...(report.storage ? [["storage", healthLine(report.storage)] as [string, string]] : []),
    ["gpus", gpus],
    ["components", components],
    ["tasks", `${report.tasks.total}${counts ? ` (${counts})` : ""}`],
    ["quarantined", quarantined],
  ]);
}
