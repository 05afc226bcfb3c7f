import type { Logger } from "pino";
import { DcgmiHealthSource } from "../dcgm/dcgmi-health.js";
import { ExporterSupervisor, type DcgmLog } from "../dcgm/exporter-supervisor.js";
import { GpuHealthMonitor } from "../dcgm/health-monitor.js";
import type { GpuHealthView, TaskMetricsSource } from "../dcgm/ports.js";
import { onPath } from "../exec/on-path.js";
import { OperationBound } from "../exec/operation-bound.js";
import { runChecked, type CommandRunner } from "../exec/run-bounded.js";
import type { GpuInventory } from "../host/gpu-inventory.js";

/*
 * DCGM's two parts, as dstack-shim decides them (runner/cmd/shim/main.go): only on an NVIDIA
 * host, DCGM Exporter when `dcgm-exporter` is installed and answers `-v`, and GPU health when a
 * source is there (here `dcgmi`: dcgm/dcgmi-health.ts says why not libdcgm). Neither ever slows
 * or stops the shim's start: only PATH is looked at before it serves, the rest runs in the
 * background, and what is missing is logged while its route answers as without DCGM.
 */

/** The DCGM parts of a shim: what the API reads, and their background life. */
export interface DcgmParts {
  readonly taskMetrics?: TaskMetricsSource;
  readonly gpuHealth?: GpuHealthView;
  /** Starts what runs in the background; the promise settles once `shutdown` stopped it all. */
  start(shutdown: AbortSignal): Promise<void>;
}

/** What {@link prepareDcgm} needs from the shim. */
export interface DcgmSetup {
  readonly inventory: GpuInventory;
  readonly exporterPort: number;
  readonly exporterIntervalMs: number;
  /** `--dcgm-address`; "" for the local nv-hostengine. */
  readonly dcgmAddress: string;
  readonly home: string;
  readonly commands: CommandRunner;
  readonly log: Logger;
  /** Whether a program is installed (a PATH lookup). */
  readonly installed?: (program: string) => Promise<boolean>;
}

/** The bound of `dcgm-exporter -v`. */
const VERSION_CHECK_MS = 10_000;

/** Decides and builds the DCGM parts; nothing runs until `start`. */
export async function prepareDcgm(setup: DcgmSetup): Promise<DcgmParts> {
  if (setup.inventory.vendor !== "nvidia") return { start: () => Promise.resolve() };
  const installed = setup.installed ?? ((program: string) => onPath(program));
  const log: DcgmLog = (level, fields, msg) => setup.log[level]({ component: "dcgm", ...fields }, msg);
  const [hasExporter, hasDcgmi] = await Promise.all([installed("dcgm-exporter"), installed("dcgmi")]);
  const exporter = hasExporter
    ? new ExporterSupervisor({
        executable: "dcgm-exporter",
        port: setup.exporterPort,
        intervalMs: setup.exporterIntervalMs,
        home: setup.home,
        log,
        versionCheck: () =>
          runChecked(setup.commands, {
            argv: ["dcgm-exporter", "-v"],
            bound: OperationBound.within(VERSION_CHECK_MS),
          }),
      })
    : undefined;
  if (!exporter) log("info", {}, "not using DCGM Exporter: dcgm-exporter is not installed");
  const monitor = hasDcgmi
    ? new GpuHealthMonitor(new DcgmiHealthSource(setup.commands, { address: setup.dcgmAddress }), log)
    : undefined;
  if (!monitor) log("info", {}, "no GPU health: dcgmi is not installed (instance health reports dcgm null)");
  return {
    ...(exporter ? { taskMetrics: exporter } : {}),
    ...(monitor ? { gpuHealth: monitor } : {}),
    start: async (shutdown) => {
      await Promise.all([exporter?.run(shutdown), monitor?.run(shutdown)]);
    },
  };
}
