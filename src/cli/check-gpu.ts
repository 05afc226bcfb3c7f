import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { Command, Option } from "@commander-js/extra-typings";
import { ShimClient, ShimUnreachableError, type ShimTaskInfo } from "../control/shim-client.js";
import { errorMessage } from "../errors/error-message.js";
import { onPath } from "../exec/on-path.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { detectGpus, type AcceleratorVendor, type GpuInventory } from "../host/gpu-inventory.js";
import {
  CliError,
  describeClientError,
  jsonOption,
  printJson,
  print,
  shimOption,
  tokenOption,
} from "./client-common.js";
import { durationFlag } from "../config/durations.js";
import {
  containerCommand,
  judgeReport,
  readContainerReport,
  VENDOR_CHECKS,
  type Seen,
} from "./gpu-check-vendors.js";
import { cell, formatTable } from "./table.js";

/*
 * `taskshim check-gpu`: the GPU path proven on a real host, through a running shim's API, the way
 * a dstack server uses it. Tasks ask for all GPUs, one, all again while that one runs (the lock
 * must refuse it) and all once more after it ended (the lock must have let go); inside each
 * container the vendor's device nodes and tool must see exactly the GPUs the task holds; and a
 * task's GPU metrics must have samples when DCGM Exporter runs. On a host without GPUs it says so
 * and checks nothing.
 */

/** One line of the table. */
export interface CheckRow {
  readonly check: string;
  readonly task: string;
  readonly seen: string;
  readonly result: "ok" | "FAIL" | "skipped";
}

/** What `check-gpu` found. */
export type CheckGpuOutcome =
  | { readonly kind: "no-gpu"; readonly why: string }
  | {
      readonly kind: "checked";
      readonly vendor: AcceleratorVendor;
      readonly image: string;
      readonly rows: readonly CheckRow[];
    };

/** What the check needs from outside: the shim, the local host, a raw GET, a clock. */
export interface CheckGpuDeps {
  readonly client: ShimClient;
  readonly shim: string;
  /** The host's own GPUs, when no shim answers. */
  detectLocal(): Promise<GpuInventory>;
  /** A GET of a shim path with the token: status and body (the task-metrics route's raw text). */
  get(path: string): Promise<{ status: number; text: string }>;
  /** Progress lines (stderr). */
  progress(line: string): void;
}

/** `check-gpu`'s settings. */
export interface CheckGpuOptions {
  readonly image?: string;
  /** How long a task may take to start (its image's pull included). */
  readonly startTimeoutMs: number;
  /** How long DCGM Exporter may take to have samples of a task. */
  readonly metricsTimeoutMs: number;
  /** Between two polls of the shim. */
  readonly pollMs?: number;
}

const VENDORS = Object.keys(VENDOR_CHECKS) as AcceleratorVendor[];
const isVendor = (v: string | undefined): v is AcceleratorVendor => VENDORS.includes(v as AcceleratorVendor);
const verdict = (seen: Seen): CheckRow["result"] =>
  seen.ok === "unchecked" ? "skipped" : seen.ok ? "ok" : "FAIL";

/** Runs the checks (see the top of this file); never leaves a task of its own behind when it can help it. */
export async function checkGpu(deps: CheckGpuDeps, options: CheckGpuOptions): Promise<CheckGpuOutcome> {
  const { client } = deps;
  const pollMs = options.pollMs ?? 1_000;
  let vendor: string | undefined;
  try {
    vendor = (await client.instanceInfo()).gpu_vendor;
  } catch (error) {
    if (!(error instanceof ShimUnreachableError)) throw error;
    const local = await deps.detectLocal();
    if (local.vendor === "none") {
      return {
        kind: "no-gpu",
        why: `no shim answers at ${deps.shim}, and this host has no GPU (device paths and vendor tools)`,
      };
    }
    throw new CliError(
      `this host has ${local.gpus.length} ${local.vendor} GPU(s) but no shim answers at ${deps.shim}: start one (taskshim serve) or pass --shim`,
    );
  }
  if (vendor === undefined || vendor === "")
    return { kind: "no-gpu", why: `the shim at ${deps.shim} reports no GPU` };
  if (!isVendor(vendor))
    throw new CliError(
      `the shim reports GPU vendor ${JSON.stringify(vendor)}, which check-gpu does not know`,
    );
  const check = VENDOR_CHECKS[vendor];
  const image = options.image ?? check.image;
  const run = `gpucheck-${Date.now().toString(36)}-${randomBytes(3).toString("hex")}`;
  const rows: CheckRow[] = [];
  const created: string[] = [];
  const row = (r: CheckRow): void => {
    rows.push(r);
    deps.progress(`${r.result.padEnd(7)} ${r.check}: ${r.seen}`);
  };

  const poll = async (
    id: string,
    done: (t: ShimTaskInfo) => boolean,
    timeoutMs: number,
    what: string,
  ): Promise<ShimTaskInfo> => {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const task = await client.getTask(id);
      if (done(task)) return task;
      if (performance.now() > deadline)
        throw new CliError(
          `task ${id} not ${what} within ${Math.round(timeoutMs / 1000)} s (status ${task.status})`,
        );
      await sleep(pollMs);
    }
  };
  const submit = async (label: string, gpu: number): Promise<string> => {
    const id = `${run}-${label}`;
    created.push(id);
    await client.submitTask(
      { id, name: id, image_name: image, gpu, command: containerCommand(check, 3_600) },
      { adoptExisting: false },
    );
    return id;
  };
  const started = (id: string) =>
    poll(id, (t) => t.status === "running" || t.status === "terminated", options.startTimeoutMs, "running");
  const report = async (id: string) => {
    const deadline = performance.now() + 60_000;
    for (;;) {
      const seen = readContainerReport(await client.logs(id, 500));
      if (seen) return seen;
      if (performance.now() > deadline)
        throw new CliError(`task ${id} printed no report within 60 s (see taskshim tasks logs ${id})`);
      await sleep(pollMs);
    }
  };
  const stop = async (id: string): Promise<ShimTaskInfo> => {
    await client.terminateTask(id, "terminated_by_user", "check-gpu", 5);
    return poll(id, (t) => t.status === "terminated", 60_000, "terminated");
  };
  /** A task asking for GPUs, looked at inside: its devices and its tool; its ids returned. */
  const inside = async (
    label: string,
    what: string,
    gpu: number,
  ): Promise<{ id: string; ids: readonly string[] } | undefined> => {
    const id = await submit(label, gpu);
    const task = await started(id);
    if (task.status !== "running") {
      row({
        check: `${what}: starts`,
        task: id,
        seen: task.termination_message || task.termination_reason || "terminated",
        result: "FAIL",
      });
      return undefined;
    }
    const ids = task.gpus_ids ?? [];
    const judged = judgeReport(check, await report(id), ids);
    row({
      check: `${what}: the vendor's devices`,
      task: id,
      seen: judged.devices.detail,
      result: verdict(judged.devices),
    });
    row({
      check: `${what}: ${check.tool.join(" ")}`,
      task: id,
      seen: judged.tool.detail,
      result: verdict(judged.tool),
    });
    return { id, ids };
  };
  const released = async (id: string, what: string): Promise<void> => {
    const ended = await stop(id);
    const held = ended.gpus_ids ?? [];
    row({
      check: `${what}: GPUs released when it ends`,
      task: id,
      seen: held.length === 0 ? "gpus_ids []" : `still ${held.join(", ")}`,
      result: held.length === 0 ? "ok" : "FAIL",
    });
  };

  try {
    const all = await inside("all", "all GPUs (gpu -1)", -1);
    if (!all) return { kind: "checked", vendor, image, rows };
    const count = all.ids.length;
    row({
      check: "all GPUs (gpu -1): GPUs held",
      task: all.id,
      seen: `${count}: ${all.ids.join(", ")}`,
      result: count > 0 ? "ok" : "FAIL",
    });
    await released(all.id, "all GPUs");
    if (count === 0) return { kind: "checked", vendor, image, rows };

    const one = await inside("one", "one GPU", 1);
    if (!one) return { kind: "checked", vendor, image, rows };
    row({
      check: "one GPU: GPUs held",
      task: one.id,
      seen: one.ids.join(", "),
      result: one.ids.length === 1 ? "ok" : "FAIL",
    });
    // The lock: all of them cannot be had while one is held, and the refusal says why.
    const blockedId = await submit("blocked", count);
    const blocked = await poll(
      blockedId,
      (t) => t.status === "running" || t.status === "terminated",
      options.startTimeoutMs,
      "decided",
    );
    const refused = blocked.status === "terminated" && /no capacity/.test(blocked.termination_message);
    row({
      check: `lock held: ${count} GPU(s) asked while one runs`,
      task: blockedId,
      seen:
        blocked.status === "terminated"
          ? blocked.termination_message || blocked.termination_reason
          : `ran with ${(blocked.gpus_ids ?? []).join(", ")}`,
      result: refused ? "ok" : "FAIL",
    });
    if (blocked.status === "running") await stop(blockedId);
    await taskMetricsRow(deps, vendor, one, options, pollMs, row);
    await released(one.id, "one GPU");

    const again = await inside("again", `all ${count} GPU(s) once the lock is free`, count);
    if (again) {
      row({
        check: "lock released: all GPUs held again",
        task: again.id,
        seen: `${again.ids.length} GPU(s)`,
        result: again.ids.length === count ? "ok" : "FAIL",
      });
      await released(again.id, "all GPUs again");
    }
    return { kind: "checked", vendor, image, rows };
  } finally {
    for (const id of created) {
      await client.terminateTask(id, "terminated_by_user", "check-gpu", 5).catch(() => undefined);
      await poll(id, (t) => t.status === "terminated", 30_000, "terminated").catch(() => undefined);
      await client.removeTask(id).catch(() => undefined);
    }
  }
}

/** `/metrics/tasks/{id}` of the one-GPU task: samples of its GPU when DCGM Exporter runs (NVIDIA). */
async function taskMetricsRow(
  deps: CheckGpuDeps,
  vendor: AcceleratorVendor,
  task: { id: string; ids: readonly string[] },
  options: CheckGpuOptions,
  pollMs: number,
  row: (r: CheckRow) => void,
): Promise<void> {
  const check = "task metrics: /metrics/tasks/{id}";
  if (vendor !== "nvidia") {
    row({ check, task: task.id, seen: "DCGM is NVIDIA's", result: "skipped" });
    return;
  }
  const deadline = performance.now() + options.metricsTimeoutMs;
  for (;;) {
    const answer = await deps.get(`/metrics/tasks/${encodeURIComponent(task.id)}`);
    if (answer.status === 404) {
      row({ check, task: task.id, seen: answer.text.trim() || "404", result: "skipped" });
      return;
    }
    const samples = answer.text
      .split("\n")
      .filter((l) => !l.startsWith("#") && task.ids.some((id) => l.includes(id)));
    const foreign = answer.text
      .split("\n")
      .filter((l) => /UUID="GPU-/.test(l) && !task.ids.some((id) => l.includes(id)));
    if (answer.status === 200 && samples.length > 0) {
      row({
        check,
        task: task.id,
        seen: `${samples.length} samples of its GPU${foreign.length > 0 ? `, ${foreign.length} of others` : ""}`,
        result: foreign.length === 0 ? "ok" : "FAIL",
      });
      return;
    }
    if (performance.now() > deadline) {
      row({
        check,
        task: task.id,
        seen: `HTTP ${answer.status}: ${answer.text.trim() || "no samples"}`,
        result: "FAIL",
      });
      return;
    }
    await sleep(pollMs);
  }
}

/** The table, and the one line under it. */
export function formatCheckGpu(outcome: CheckGpuOutcome): string {
  if (outcome.kind === "no-gpu") return `no GPU: ${outcome.why}; nothing to check`;
  const table = formatTable(
    ["CHECK", "TASK", "SEEN", "RESULT"],
    outcome.rows.map((r) => [cell(r.check), cell(r.task), cell(r.seen, 60), r.result]),
  );
  const failed = outcome.rows.filter((r) => r.result === "FAIL").length;
  return `${table}\n${outcome.vendor}, image ${outcome.image}: ${failed === 0 ? "every check passed" : `${failed} check(s) failed`}`;
}

/** `taskshim check-gpu`. */
export function addCheckGpuCommand(program: Command): void {
  program
    .command("check-gpu")
    .description(
      "Check the GPU path on this host through a running shim: devices, vendor tool, GPU locks, task metrics",
    )
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(
      new Option(
        "--image <image>",
        "the image the check tasks run (default: one per vendor, see docs/operations.md)",
      ),
    )
    .addOption(
      new Option("--start-timeout <duration>", "how long a check task may take to start, its pull included")
        .default(600_000, "10m")
        .argParser(durationFlag(1_000, 3_600_000)),
    )
    .addOption(jsonOption())
    .action(async (options) => {
      let token: string | undefined;
      if (options.authTokenFile !== undefined) {
        token = (
          await readFile(options.authTokenFile, "utf8").catch((error: unknown) => {
            throw new CliError(`cannot read --auth-token-file: ${errorMessage(error)}`);
          })
        ).trim();
      }
      let origin: string;
      try {
        origin = new URL(options.shim).origin;
      } catch {
        throw new CliError(`invalid --shim URL ${JSON.stringify(options.shim)}`);
      }
      const client = new ShimClient(origin, 9_000, token === undefined ? {} : { authToken: token });
      const deps: CheckGpuDeps = {
        client,
        shim: options.shim,
        detectLocal: () =>
          detectGpus(new BoundedCommandRunner(new AbortController().signal), {
            installed: (tool) => onPath(tool),
          }),
        get: async (path) => {
          const response = await fetch(`${origin}${path}`, {
            headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
            signal: AbortSignal.timeout(15_000),
          });
          return { status: response.status, text: await response.text() };
        },
        progress: (line) => process.stderr.write(`${line}\n`),
      };
      let outcome: CheckGpuOutcome;
      try {
        outcome = await checkGpu(deps, {
          ...(options.image !== undefined ? { image: options.image } : {}),
          startTimeoutMs: options.startTimeout,
          metricsTimeoutMs: 60_000,
        });
      } catch (error) {
        if (error instanceof CliError) throw error;
        throw new CliError(describeClientError(error, options.shim), { cause: error });
      }
      if (options.json) printJson(outcome);
      else print(formatCheckGpu(outcome));
      if (outcome.kind === "checked" && outcome.rows.some((r) => r.result === "FAIL")) process.exitCode = 1;
    });
}
