import { setTimeout as sleep } from "node:timers/promises";
import { ShimClient } from "../../src/control/shim-client.js";
import { errorMessage } from "../../src/errors/error-message.js";
import type { ShimProcess } from "../../test/support/shim-process.js";
import { sumOf } from "./prometheus.js";
import { readMetrics } from "./shim-metrics.js";

/** The shim's gauge of its open event streams. */
const OPEN_STREAMS = "taskshim_event_streams";
const CONNECT_TIMEOUT_MS = 10_000;

/**
 * When each task became `running`, as the shim's own event stream (`GET /api/events`) stamps the
 * change: the moment the status is in the store, after its durable write, i.e. the first moment a
 * `GET /api/tasks/{id}` answers `running`. A polling client would add its poll's phase (±half
 * the interval) as noise and its CPU to the engine's start it waits for: measured on this kind
 * of machine, a poll every 50 ms slowed the engine's start by ~5 ms, every 20 ms by 15-20 ms,
 * and that would be charged to the shim, since the baseline does not poll. The stream's client is
 * idle between the shim's writes (one per 50 ms at most).
 */
export class RunningTimes {
  private readonly stop = new AbortController();
  private readonly times = new Map<string, number>();
  private readonly failures = new Map<string, string>();
  private readonly waiters = new Map<string, () => void>();
  private readonly done: Promise<void>;

  private constructor(client: ShimClient) {
    // A stream that ends (the shim stopped) or fails wakes every waiter with the reason.
    const end = (why: string): void => {
      this.failures.set("*", why);
      for (const wake of this.waiters.values()) wake();
    };
    this.done = this.follow(client).then(
      () => end("the event stream ended"),
      (error: unknown) => end(`the event stream failed: ${errorMessage(error)}`),
    );
  }

  /**
   * Follows `shim`'s event stream, once the shim counts it among its open streams (from then on
   * it is sent every change); the shim must have no other stream open.
   */
  static async open(shim: ShimProcess): Promise<RunningTimes> {
    const times = new RunningTimes(new ShimClient(shim.url));
    const deadline = performance.now() + CONNECT_TIMEOUT_MS;
    while (sumOf((await readMetrics(shim)).samples, OPEN_STREAMS) < 1) {
      if (performance.now() > deadline) {
        await times.close();
        throw new Error(`the shim's event stream did not open within ${CONNECT_TIMEOUT_MS} ms`);
      }
      await sleep(10);
    }
    return times;
  }

  private async follow(client: ShimClient): Promise<void> {
    for await (const event of client.events(this.stop.signal)) {
      if (event.kind !== "changed") continue;
      if (event.to === "running") this.times.set(event.id, Date.parse(event.time));
      else if (event.to === "terminated")
        this.failures.set(event.id, `terminated (${event.termination_reason})`);
      else continue;
      this.waiters.get(event.id)?.();
    }
  }

  /**
   * The epoch ms at which task `id` became `running` (it may have already); throws if it
   * terminated instead, the stream failed, or `timeoutMs` passed.
   */
  async runningAt(id: string, timeoutMs: number): Promise<number> {
    const deadline = AbortSignal.timeout(timeoutMs);
    for (;;) {
      const time = this.times.get(id);
      if (time !== undefined) return time;
      const failure = this.failures.get(id) ?? this.failures.get("*");
      if (failure !== undefined) throw new Error(`task ${id}: ${failure}`);
      if (deadline.aborted) throw new Error(`task ${id}: not running after ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          deadline.removeEventListener("abort", wake);
          this.waiters.delete(id);
          resolve();
        };
        this.waiters.set(id, wake);
        deadline.addEventListener("abort", wake, { once: true });
      });
    }
  }

  /** Stops following the stream. */
  async close(): Promise<void> {
    this.stop.abort();
    await this.done;
  }
}
