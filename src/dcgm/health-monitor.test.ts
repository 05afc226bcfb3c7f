import { describe, expect, it } from "vitest";
import { GpuHealthMonitor } from "./health-monitor.js";
import { DCGM_HEALTH, type DcgmHealth, type GpuHealthSource } from "./ports.js";

const HEALTHY: DcgmHealth = { overall_health: DCGM_HEALTH.pass, incidents: [] };
const WARNING: DcgmHealth = {
  overall_health: DCGM_HEALTH.warn,
  incidents: [
    {
      system: 0x1,
      health: DCGM_HEALTH.warn,
      error_message: "Detected more than 8 PCIe replays per minute for GPU 0 : 99999",
      error_code: 0,
      entity_group_id: 1,
      entity_id: 0,
    },
  ],
};
const FAILURE: DcgmHealth = {
  overall_health: DCGM_HEALTH.fail,
  incidents: [
    { ...WARNING.incidents[0]!, health: DCGM_HEALTH.warn },
    {
      system: 0x10,
      health: DCGM_HEALTH.fail,
      error_message: "Detected 888 volatile double-bit ECC error(s) in GPU 1.",
      error_code: 0,
      entity_group_id: 1,
      entity_id: 1,
    },
  ],
};

/** A source answering from a queue of outcomes: a health, an error, or "hang" (never settles unless aborted). */
function scripted(
  ...outcomes: (DcgmHealth | Error | "hang" | "hang-deaf")[]
): GpuHealthSource & { calls: number } {
  const source = {
    name: "fake",
    calls: 0,
    check(signal: AbortSignal): Promise<DcgmHealth> {
      const next = outcomes[Math.min(source.calls, outcomes.length - 1)];
      source.calls += 1;
      if (next === "hang") {
        return new Promise((_, reject) =>
          signal.addEventListener("abort", () => reject(new Error("aborted"))),
        );
      }
      // A source that ignores its signal: the monitor must not wait for it either.
      if (next === "hang-deaf") return new Promise(() => undefined);
      return next instanceof Error ? Promise.reject(next) : Promise.resolve(next!);
    },
  };
  return source;
}

function logSink() {
  const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
  return {
    lines,
    log: (level: string, fields: Record<string, unknown>, msg: string) => lines.push({ level, msg, fields }),
  };
}

describe("GpuHealthMonitor", () => {
  it("is null before its first answer: no source has answered yet", () => {
    const monitor = new GpuHealthMonitor(scripted(HEALTHY), logSink().log);
    expect(monitor.current()).toBeNull();
  });

  it("serves a healthy answer, then warning and failure incidents as the source gives them", async () => {
    const monitor = new GpuHealthMonitor(scripted(HEALTHY, WARNING, FAILURE), logSink().log);
    const shutdown = new AbortController().signal;
    await monitor.refresh(shutdown);
    expect(monitor.current()).toEqual({ overall_health: 0, incidents: [] });
    await monitor.refresh(shutdown);
    expect(monitor.current()).toEqual(WARNING);
    await monitor.refresh(shutdown);
    expect(monitor.current()?.overall_health).toBe(20);
    expect(monitor.current()?.incidents.map((i) => [i.system, i.health])).toEqual([
      [1, 10],
      [16, 20],
    ]);
  });

  it("turns a source error into null (as dstack-shim does), logs it once per failing stretch, and recovers", async () => {
    const sink = logSink();
    const monitor = new GpuHealthMonitor(
      scripted(HEALTHY, new Error("nv-hostengine is not running"), new Error("still down"), WARNING),
      sink.log,
    );
    const shutdown = new AbortController().signal;
    await monitor.refresh(shutdown);
    await monitor.refresh(shutdown);
    expect(monitor.current()).toBeNull();
    await monitor.refresh(shutdown);
    expect(monitor.current()).toBeNull();
    const warnings = sink.lines.filter((l) => l.level === "warn");
    expect(warnings.map((l) => l.fields.error)).toEqual(["nv-hostengine is not running"]);
    await monitor.refresh(shutdown);
    expect(monitor.current()).toEqual(WARNING);
    expect(sink.lines.at(-1)?.msg).toBe("GPU health answers again");
  });

  it("never makes a reader wait: a hung check leaves the last answer served, then null at its deadline", async () => {
    const monitor = new GpuHealthMonitor(scripted(HEALTHY, "hang-deaf"), logSink().log, { deadlineMs: 150 });
    const shutdown = new AbortController().signal;
    await monitor.refresh(shutdown);
    const hung = monitor.refresh(shutdown);
    // While the check hangs, the reader gets the last answer at once.
    const startedAt = performance.now();
    expect(monitor.current()).toEqual(HEALTHY);
    expect(performance.now() - startedAt).toBeLessThan(5);
    await hung;
    // The deadline passed: the source did not answer, so no health is claimed.
    expect(monitor.current()).toBeNull();
  });

  it("is null during a first check that hangs, and the refresh ends at the deadline even when the source listens", async () => {
    const monitor = new GpuHealthMonitor(scripted("hang"), logSink().log, { deadlineMs: 100 });
    const refresh = monitor.refresh(new AbortController().signal);
    expect(monitor.current()).toBeNull();
    const startedAt = performance.now();
    await refresh;
    expect(performance.now() - startedAt).toBeLessThan(1_000);
    expect(monitor.current()).toBeNull();
  });

  it("stops serving an answer older than maxAgeMs (the source stopped being asked or answering)", async () => {
    let now = 1_000;
    const monitor = new GpuHealthMonitor(scripted(HEALTHY), logSink().log, { maxAgeMs: 60_000 }, () => now);
    await monitor.refresh(new AbortController().signal);
    now += 60_000;
    expect(monitor.current()).toEqual(HEALTHY);
    now += 1;
    expect(monitor.current()).toBeNull();
  });

  it("runs until shutdown, checking every period, and stops at once when asked", async () => {
    const source = scripted(HEALTHY);
    const monitor = new GpuHealthMonitor(source, logSink().log, { periodMs: 10 });
    const shutdown = new AbortController();
    const running = monitor.run(shutdown.signal);
    await new Promise((resolve) => setTimeout(resolve, 80));
    shutdown.abort();
    await running;
    expect(source.calls).toBeGreaterThanOrEqual(3);
    expect(monitor.current()).toEqual(HEALTHY);
  });

  it("does not log or forget the last answer for a check cut by the shutdown", async () => {
    const sink = logSink();
    const monitor = new GpuHealthMonitor(scripted(HEALTHY, "hang"), sink.log, { deadlineMs: 10_000 });
    const shutdown = new AbortController();
    await monitor.refresh(shutdown.signal);
    const cut = monitor.refresh(shutdown.signal);
    shutdown.abort();
    await cut;
    expect(monitor.current()).toEqual(HEALTHY);
    expect(sink.lines).toEqual([]);
  });
});
