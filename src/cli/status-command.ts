import type { Command } from "@commander-js/extra-typings";
import { ShimHttpError, type Healthcheck, type ShimClient } from "../control/shim-client.js";
import { jsonOption, print, printJson, run, shimOption, tokenOption } from "./client-common.js";
import { allTaskInfos } from "./task-filter.js";
import { countByStatus, formatStatusReport, parseQuarantined, type ShimStatusReport } from "./task-views.js";

/** The status, and the rollback its supervisor last made (a new binary that did not serve). */
type StatusWithRollback = ShimStatusReport & { readonly rollback?: NonNullable<Healthcheck["rollback"]> };

async function statusReport(client: ShimClient): Promise<StatusWithRollback> {
  const health = await client.healthcheck();
  // Older shims lack some endpoints (404): those parts are reported as not supported.
  const optional = <T>(promise: Promise<T>): Promise<T | undefined> =>
    promise.catch((error: unknown) => {
      if (error instanceof ShimHttpError && (error.status === 404 || error.status === 405)) return undefined;
      throw error;
    });
  const [info, components, live, metrics] = await Promise.all([
    optional(client.instanceInfo()),
    optional(client.getComponents()),
    allTaskInfos(client, (status) => status !== "terminated"),
    optional(client.metrics()),
  ]);
  const all = await client.listTasks();
  const gpusInUse = new Set(live.infos.flatMap((t) => t.gpus_ids ?? []));
  return {
    shim: client.baseUrl,
    service: health.service,
    version: health.version,
    implementation: health.implementation ?? null,
    engine: health.engine ?? null,
    ...(health.storage ? { storage: health.storage } : {}),
    ...(health.lifecycle ? { lifecycle: health.lifecycle } : {}),
    gpu: {
      vendor: info?.gpu_vendor ?? null,
      driver_version: info?.gpu_driver_version ?? null,
      in_use: gpusInUse.size,
    },
    components: components ?? null,
    tasks: { total: all.length, by_status: countByStatus(all) },
    quarantined_state_files: (metrics !== undefined ? parseQuarantined(metrics) : undefined) ?? null,
    ...(health.rollback ? { rollback: health.rollback } : {}),
  };
}

/** `taskshim status`: one shim at a glance (text, or --json). */
export function addStatusCommand(program: Command): void {
  program
    .command("status")
    .description("show a shim: version, Docker Engine health, GPUs, components, task counts by status")
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (options) =>
      run(options, async (client) => {
        const report = await statusReport(client);
        if (options.json) printJson(report);
        else print(`${formatStatusReport(report)}${rollbackLine(report)}`);
      }),
    );
}

/** The line a rollback adds to the text status (none without one). */
export function rollbackLine(report: StatusWithRollback): string {
  const rollback = report.rollback;
  if (rollback === undefined) return "";
  // Aligned with the report's other fields (`gpus:         …`).
  return `\nrolled back:  ${rollback.at}: the new binary at ${rollback.binary} ${rollback.reason}; the previous one runs`;
}
