import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import { ShimClient, ShimHttpError, type Healthcheck } from "./shim-client.js";
import { errorMessage } from "../errors/error-message.js";

/**
 * What identified the installed binary, against the running shim before the restart and the
 * restarted one after it:
 * - `build_id`: the installed binary reports a build id. The shim is already current iff the
 *   running shim reports the same one; otherwise the restart is done once the healthcheck
 *   reports it.
 * - `version`: it reports none (a release before build ids, e.g. a rollback to 1.0.0). The shim
 *   is never already current (two builds of one version cannot be told apart); the restart is
 *   done once the healthcheck reports that version and no build id.
 */
export type UpgradeComparison = "build_id" | "version";

/**
 * How one shim's upgrade ended:
 * - `upgraded`: the new build answers, every task kept;
 * - `already-current`: the running build is the one the URL serves; nothing was installed or restarted;
 * - `rolled-back`: the new build did not serve, and the shim's supervisor put the previous binary
 *   back (the build that ran before answers again, from a new process);
 * - `refused`: another upgrade of this shim is under way (its install answered 409); nothing done;
 * - `failed`: anything else; `error` says which step and why.
 */
export type UpgradeOutcome = "upgraded" | "already-current" | "rolled-back" | "refused" | "failed";

/** How one shim's upgrade went. */
export interface UpgradeResult {
  readonly shim: string;
  readonly outcome: UpgradeOutcome;
  /** What the decision and the wait compared; null when it failed before the install ended. */
  readonly compared: UpgradeComparison | null;
  /** The running shim's version before the upgrade. */
  readonly from: string;
  /** Its build id (healthcheck `build.build_id`); null when it reports none. */
  readonly fromBuildId: string | null;
  /** The installed binary's version. */
  readonly to: string;
  /** Its build id (the component's `build_id`); null when it reports none. */
  readonly toBuildId: string | null;
  /** Shutdown requested → new version answering, in ms. */
  readonly windowMs: number | null;
  readonly tasksBefore: number;
  /** How many of them were listed after the restart; null when it never got that far. */
  readonly tasksKept: number | null;
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
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    // A probe that cannot reach the shim (it restarts) polls again; one that found a verdict
    // (an UpgradeError: the install failed; a rollback) ends the wait at once.
    const value = await probe().catch((error: unknown) => {
      if (error instanceof UpgradeError || error instanceof RolledBack) throw error;
      return undefined;
    });
    if (value !== undefined) return value;
    // Stryker disable next-line EqualityOperator: a fractional monotonic clock is never read at the deadline exactly; the next poll ends the wait either way
    if (performance.now() > deadline) throw new UpgradeError(`${what}: not within ${timeoutMs} ms`);
    await sleep(pollMs);
  }
}

/** The new process answered, but as the build that ran before: its supervisor rolled back. */
class RolledBack extends Error {
  // Stryker disable next-line StringLiteral: only told by instanceof and read by its message, never by its name
  override readonly name = "RolledBack";
}

/** `process_start_time_seconds` of the shim's `/metrics`: which process answers. */
async function processStart(client: ShimClient): Promise<string> {
  const found = /^process_start_time_seconds (\S+)$/m.exec(await client.metrics())?.[1];
  if (found === undefined) throw new UpgradeError("/metrics has no process_start_time_seconds");
  return found;
}

/**
 * Upgrades one shim: install the binary (verified by sha256), wait for `installed`, decide from
 * the build identities whether it is already current (see {@link UpgradeComparison}), check the
 * restart gate, ask for a graceful shutdown, wait until the new build answers, and verify that
 * the task list kept every task.
 */
export async function upgradeShim(
  shimUrl: string,
  binaryUrl: string,
  sha256: string | undefined,
  timings: UpgradeTimings = DEFAULT_UPGRADE_TIMINGS,
): Promise<UpgradeResult> {
  const client = new ShimClient(shimUrl);
  let compared: UpgradeComparison | null = null;
  let from = "";
  let fromBuildId: string | null = null;
  let to = "";
  let toBuildId: string | null = null;
  let tasksBefore = 0;
  const result = (
    outcome: UpgradeResult["outcome"],
    rest: Pick<UpgradeResult, "windowMs" | "tasksKept" | "error">,
  ): UpgradeResult => ({
    shim: shimUrl,
    outcome,
    compared,
    from,
    fromBuildId,
    to,
    toBuildId,
    tasksBefore,
    ...rest,
  });
  try {
    const health = await client.healthcheck();
    from = health.version;
    fromBuildId = health.build?.build_id ?? null;
    const before = await client.listTasks();
    tasksBefore = before.length;
    try {
      await client.installComponent("dstack-shim", binaryUrl, sha256);
    } catch (error) {
      // Another upgrade (or a dstack server's check) is installing: what it installs is not this
      // run's to report, nor to restart into.
      if (error instanceof ShimHttpError && error.status === 409) {
        return result("refused", {
          windowMs: null,
          tasksKept: null,
          error: "refused: another upgrade is in progress (the shim is installing)",
        });
      }
      throw error;
    }
    const installed = await until("install", timings.installTimeoutMs, timings.pollMs, async () => {
      const shim = (await client.getComponents()).find((c) => c.name === "dstack-shim");
      if (shim?.status === "error")
        throw new UpgradeError(
          "install ended in status error (download, checksum or --version check failed)",
        );
      // A taskshim whose install failed reports the binary still in place (`installed`, its
      // version) and why in `error`: that is a failed upgrade, not the old binary "installed".
      if (shim?.status === "installed" && shim.error !== undefined)
        throw new UpgradeError(`install failed: ${shim.error}`);
      return shim?.status === "installed" ? shim : undefined;
    }).catch((error: unknown) => {
      throw error instanceof UpgradeError ? error : new UpgradeError(String(error));
    });
    to = installed.version;
    toBuildId = installed.build_id ?? null;
    compared = toBuildId === null ? "version" : "build_id";
    // Never from the version alone: every build of a release carries the same one.
    if (toBuildId !== null && toBuildId === fromBuildId) {
      return result("already-current", { windowMs: null, tasksKept: tasksBefore });
    }
    // The old process keeps answering until it has drained. With no build id on either side and
    // one version, its healthcheck is the new one's: only its start time tells them apart.
    const lookAlike = toBuildId === null && fromBuildId === null && to === from;
    // Also how a rollback is told from the old process still draining: the same build, another start.
    const oldStart = lookAlike
      ? await processStart(client).catch((error: unknown) => {
          throw new UpgradeError(
            `cannot tell the restarted shim from this one (same version ${to}, no build id): ${errorMessage(error)}`,
          );
        })
      : await processStart(client).catch(() => undefined);
    const rollbackBefore = health.rollback?.at;
    const gate = await client.isSafeToRestart();
    if (!gate.safe) {
      const blocking = gate.blocking.map((t) => `${t.id}:${t.status}`).join(", ");
      throw new UpgradeError(
        `not safe to restart: tasks in restart-unsafe statuses: ${blocking || "(old API)"}`,
      );
    }
    await client.shutdown(false);
    const requestedAt = performance.now();
    const expected = toBuildId === null ? `version ${to}, another process` : `build ${toBuildId}`;
    const isNew = async (
      answer: Healthcheck,
      probe: ShimClient,
      startBefore: string | undefined,
    ): Promise<boolean> => {
      // The supervisor put the previous binary back: a rollback newer than the one seen before.
      if (answer.rollback !== undefined && answer.rollback.at !== rollbackBefore) {
        throw new RolledBack(
          `rolled back by the shim's supervisor: the new binary ${answer.rollback.reason}`,
        );
      }
      const answerBuild = answer.build?.build_id ?? null;
      const asBefore = answer.version === from && answerBuild === fromBuildId;
      // The build that ran before, from another process (a supervisor without the report). The
      // start time was read before the healthcheck: a process that started after the old one
      // answered both, since processes only ever follow each other.
      if (asBefore && startBefore !== undefined && startBefore !== oldStart) {
        throw new RolledBack(
          `the shim came back as the build it ran before (${buildCell(from, fromBuildId)})`,
        );
      }
      // Neither build: another upgrade replaced the binary meanwhile; waiting cannot help.
      if (toBuildId !== null && answerBuild !== null && answerBuild !== toBuildId && !asBefore) {
        throw new UpgradeError(
          `another build answers (${buildCell(answer.version, answerBuild)}): the binary was replaced meanwhile`,
        );
      }
      if (toBuildId !== null) return answerBuild === toBuildId;
      // The installed build is unknown (its binary, or the shim that checked it, predates build
      // ids): the new process is any of that version that is not the old one.
      if (answer.version !== to) return false;
      const build = answer.build?.build_id ?? null;
      if (build !== fromBuildId) return true;
      if (fromBuildId !== null) return false; // the old process, still draining
      return oldStart === undefined || (await processStart(probe)) !== oldStart;
    };
    const rolledBack = await until(
      `restart as ${expected}`,
      timings.restartTimeoutMs,
      timings.pollMs,
      async () => {
        const probe = new ShimClient(shimUrl, 2_000);
        const startBefore =
          oldStart !== undefined && !lookAlike ? await processStart(probe).catch(() => undefined) : undefined;
        const answer = await probe.healthcheck();
        return (await isNew(answer, probe, startBefore)) ? { rolledBack: undefined } : undefined;
      },
    ).catch((error: unknown) => {
      if (error instanceof RolledBack) return { rolledBack: error.message };
      throw error;
    });
    const windowMs = Math.round(performance.now() - requestedAt);
    if (rolledBack.rolledBack !== undefined) {
      const after = new Set((await client.listTasks()).map((t) => t.id));
      const kept = before.filter((t) => after.has(t.id)).length;
      return result("rolled-back", { windowMs, tasksKept: kept, error: rolledBack.rolledBack });
    }
    const after = new Set((await client.listTasks()).map((t) => t.id));
    const missing = before.filter((t) => !after.has(t.id));
    if (missing.length > 0) {
      return result("failed", {
        windowMs,
        tasksKept: tasksBefore - missing.length,
        error: `tasks lost: ${missing.map((t) => t.id).join(", ")}`,
      });
    }
    return result("upgraded", { windowMs, tasksKept: tasksBefore });
  } catch (error) {
    return result("failed", { windowMs: null, tasksKept: null, error: errorMessage(error) });
  }
}

/** Whether a shim ended on the build it was asked for: upgraded, or already current. */
export function succeeded(result: UpgradeResult): boolean {
  return result.outcome === "upgraded" || result.outcome === "already-current";
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

/** A version with its build id as semver build metadata (`1.0.0+9f86d081884c7d659a2f`), or "-". */
function buildCell(version: string, buildId: string | null): string {
  if (version === "") return "-";
  return buildId === null ? version : `${version}+${buildId}`;
}

/** A plain-text table of results, one row per shim. */
export function formatUpgradeTable(results: readonly UpgradeResult[]): string {
  const header = ["shim", "outcome", "compared", "from", "to", "window ms", "tasks kept", "error"];
  const rows = results.map((r) => [
    r.shim,
    r.outcome,
    r.compared ?? "-",
    buildCell(r.from, r.fromBuildId),
    buildCell(r.to, r.toBuildId),
    r.windowMs === null ? "-" : String(r.windowMs),
    r.tasksKept === null ? "not checked" : `${r.tasksKept}/${r.tasksBefore}`,
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
