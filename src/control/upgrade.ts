import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import { ShimClient, ShimHttpError } from "./shim-client.js";
import { errorMessage } from "../errors/error-message.js";

/** How one shim's upgrade went. */
export interface UpgradeResult {
  readonly shim: string;
  readonly outcome: "upgraded" | "already-current" | "failed";
  readonly from: string;
  readonly to: string;
  /** Shutdown requested → new version answering, in ms. */
  readonly windowMs: number | null;
  readonly tasksBefore: number;
  readonly tasksKept: number;
  readonly error?: string;
}

/** Timings of a rollout (defaults suit real hosts; tests shorten them). */
export interface UpgradeTimings {
  readonly installTimeoutMs: number;
  readonly restartTimeoutMs: number;
  readonly pollMs: number;
}

export const DEFAULT_UPGRADE_TIMINGS: UpgradeTimings = {
  installTimeoutMs: 10 * 60_000,
  restartTimeoutMs: 2 * 60_000,
  pollMs: 100,
};

/** A step of the rollout failed; the message says which and why. */
export class UpgradeError extends Error {
  override readonly name = "UpgradeError";
}

async function until<T>(
  what: string,
  timeoutMs: number,
  pollMs: number,
  probe: () => Promise<T | undefined>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new UpgradeError(`${what}: not within ${timeoutMs} ms`);
    await sleep(pollMs);
  }
}

/**
 * Upgrades one shim: install the binary (verified by sha256), wait for `installed`, check the
 * restart gate, ask for a graceful shutdown, wait until the new version answers, and verify
 * that the task list kept every task.
 */
export async function upgradeShim(
  shimUrl: string,
  binaryUrl: string,
  sha256: string | undefined,
  timings: UpgradeTimings = DEFAULT_UPGRADE_TIMINGS,
): Promise<UpgradeResult> {
  const client = new ShimClient(shimUrl);
  let from = "";
  let to = "";
  let tasksBefore = 0;
  try {
    from = (await client.healthcheck()).version;
    const before = await client.listTasks();
    tasksBefore = before.length;
    try {
      await client.installComponent("dstack-shim", binaryUrl, sha256);
    } catch (error) {
      if (!(error instanceof ShimHttpError && error.status === 409)) throw error;
      // Already installing: wait for that install to end, then judge what it installed.
    }
    const installed = await until("install", timings.installTimeoutMs, timings.pollMs, async () => {
      const shim = (await client.getComponents()).find((c) => c.name === "dstack-shim");
      if (shim?.status === "error")
        throw new UpgradeError(
          "install ended in status error (download, checksum or --version check failed)",
        );
      return shim?.status === "installed" ? shim : undefined;
    }).catch((error: unknown) => {
      throw error instanceof UpgradeError ? error : new UpgradeError(String(error));
    });
    to = installed.version;
    if (to === from) {
      return {
        shim: shimUrl,
        outcome: "already-current",
        from,
        to,
        windowMs: null,
        tasksBefore,
        tasksKept: tasksBefore,
      };
    }
    const gate = await client.isSafeToRestart();
    if (!gate.safe) {
      const blocking = gate.blocking.map((t) => `${t.id}:${t.status}`).join(", ");
      throw new UpgradeError(
        `not safe to restart: tasks in restart-unsafe statuses: ${blocking || "(old API)"}`,
      );
    }
    await client.shutdown(false);
    const requestedAt = performance.now();
    await until("restart with the new version", timings.restartTimeoutMs, timings.pollMs, async () => {
      const health = await new ShimClient(shimUrl, 2_000).healthcheck();
      return health.version === to ? health : undefined;
    });
    const windowMs = Math.round(performance.now() - requestedAt);
    const after = new Set((await client.listTasks()).map((t) => t.id));
    const missing = before.filter((t) => !after.has(t.id));
    if (missing.length > 0) {
      return {
        shim: shimUrl,
        outcome: "failed",
        from,
        to,
        windowMs,
        tasksBefore,
        tasksKept: tasksBefore - missing.length,
        error: `tasks lost: ${missing.map((t) => t.id).join(", ")}`,
      };
    }
    return { shim: shimUrl, outcome: "upgraded", from, to, windowMs, tasksBefore, tasksKept: tasksBefore };
  } catch (error) {
    return {
      shim: shimUrl,
      outcome: "failed",
      from,
      to,
      windowMs: null,
      tasksBefore,
      tasksKept: 0,
      error: errorMessage(error),
    };
  }
}

/** Upgrades many shims with at most `concurrency` at a time; results in input order. */
export async function upgradeFleet(
  shims: readonly string[],
  binaryUrl: string,
  sha256: string | undefined,
  concurrency: number,
  timings: UpgradeTimings = DEFAULT_UPGRADE_TIMINGS,
): Promise<UpgradeResult[]> {
  const limit = pLimit(Math.max(1, concurrency));
  return Promise.all(shims.map((shim) => limit(() => upgradeShim(shim, binaryUrl, sha256, timings))));
}

/** A plain-text table of results, one row per shim. */
export function formatUpgradeTable(results: readonly UpgradeResult[]): string {
  const header = ["shim", "outcome", "from", "to", "window ms", "tasks kept", "error"];
  const rows = results.map((r) => [
    r.shim,
    r.outcome,
    r.from || "-",
    r.to || "-",
    r.windowMs === null ? "-" : String(r.windowMs),
    `${r.tasksKept}/${r.tasksBefore}`,
    r.error ?? "",
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] ?? "").length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}
