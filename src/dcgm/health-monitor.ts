import { setTimeout as sleep } from "node:timers/promises";
import { errorMessage } from "../errors/error-message.js";
import type { DcgmLog } from "./exporter-supervisor.js";
import type { DcgmHealth, GpuHealthSource, GpuHealthView } from "./ports.js";

/*
 * GPU health, asked in the background and read from memory. dstack-shim asks libdcgm on the
 * request's path (runner/internal/shim/api/handlers.go, InstanceHealthHandler); here the source
 * may be an external command, so a slow or hung DCGM must never slow `GET /api/instance/health`
 * (dstack's server asks it with the instance's other checks): the route reads the last answer.
 */

/** The monitor's period and bounds. */
export interface HealthMonitorTimings {
  /** Between two checks. */
  readonly periodMs: number;
  /** One check's deadline: past it, the check counts as failed. */
  readonly deadlineMs: number;
  /** An answer older than this is not served (null): the source has stopped answering. */
  readonly maxAgeMs: number;
}

/** Production timings: a check every 15 s, 10 s each at most, served for up to a minute. */
export const HEALTH_MONITOR_TIMINGS: HealthMonitorTimings = {
  periodMs: 15_000,
  deadlineMs: 10_000,
  maxAgeMs: 60_000,
};

/** A health check that did not finish within its deadline. */
export class HealthCheckTimeoutError extends Error {
  override readonly name = "HealthCheckTimeoutError";
}

/** What the monitor holds: an answer and when it came, or the reason there is none. */
type Last =
  | { readonly kind: "none" }
  | { readonly kind: "answer"; readonly health: DcgmHealth; readonly at: number }
  | { readonly kind: "failed"; readonly error: string };

/**
 * Asks `source` every `periodMs` under `deadlineMs` and keeps the last answer. `current()` is
 * what the route serves: the last answer while younger than `maxAgeMs`; null before the first
 * one, after a failed check (as dstack-shim, whose handler sends null when libdcgm fails), and
 * when answers have stopped coming.
 */
export class GpuHealthMonitor implements GpuHealthView {
  private readonly timings: HealthMonitorTimings;
  private last: Last = { kind: "none" };
  private failing = false;

  constructor(
    private readonly source: GpuHealthSource,
    private readonly log: DcgmLog,
    timings: Partial<HealthMonitorTimings> = {},
    private readonly now: () => number = () => performance.now(),
  ) {
    this.timings = { ...HEALTH_MONITOR_TIMINGS, ...timings };
  }

  current(): DcgmHealth | null {
    if (this.last.kind !== "answer") return null;
    return this.now() - this.last.at <= this.timings.maxAgeMs ? this.last.health : null;
  }

  /** One check under the deadline; its outcome replaces the last one. Never rejects. */
  async refresh(shutdown: AbortSignal): Promise<void> {
    const deadline = AbortSignal.timeout(this.timings.deadlineMs);
    const signal = AbortSignal.any([shutdown, deadline]);
    try {
      const health = await Promise.race([
        this.source.check(signal),
        // A source that ignores its signal is not waited for past the deadline.
        new Promise<never>((_, reject) =>
          signal.addEventListener(
            "abort",
            () =>
              reject(
                new HealthCheckTimeoutError(
                  shutdown.aborted
                    ? "interrupted by the shim's shutdown"
                    : `no answer within ${this.timings.deadlineMs} ms`,
                ),
              ),
            { once: true },
          ),
        ),
      ]);
      if (this.failing) this.log("info", { source: this.source.name }, "GPU health answers again");
      this.failing = false;
      this.last = { kind: "answer", health, at: this.now() };
    } catch (error) {
      if (shutdown.aborted) return;
      const message = errorMessage(error);
      // Logged once per failing stretch, not every period.
      if (!this.failing) {
        this.log(
          "warn",
          { source: this.source.name, error: message },
          "GPU health check failed; reported as null",
        );
      }
      this.failing = true;
      this.last = { kind: "failed", error: message };
    }
  }

  /** Checks every period until `shutdown` aborts; resolves then, never rejects. */
  async run(shutdown: AbortSignal): Promise<void> {
    while (!shutdown.aborted) {
      await this.refresh(shutdown);
      await sleep(this.timings.periodMs, undefined, { signal: shutdown }).catch(() => undefined);
    }
  }
}
