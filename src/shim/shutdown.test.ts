import { describe, expect, it } from "vitest";
import type { HomeLock } from "../state/home-lock.js";
import type { LogFileSink } from "../state/log-file-sink.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { ShimShutdown, type DrainPlan } from "./shutdown.js";
import { StartInterruptedError } from "./start-interruption.js";

const timings = { graceMs: 50, boundMs: 200 };

/** A shutdown over a lock and log file that record what was released, in order. */
function shutdownUnderTest() {
  const { log, lines } = capturingLogger();
  const released: string[] = [];
  const lock = { release: () => Promise.resolve(void released.push("lock")) } as unknown as HomeLock;
  const logFile = { close: () => void released.push("logFile") } as unknown as LogFileSink;
  const shutdown = new ShimShutdown({ log, lock, logFile }, timings);
  shutdown.atStop(() => released.push("homeWatch"));
  const msgs = () => lines.map((line) => (JSON.parse(line) as { msg: string; phase?: string }).phase ?? "");
  return { shutdown, released, msgs };
}

/** A plan whose one step settles when told to, or never. */
function plan(): DrainPlan & { settle: () => void; closed: number; stoppedNow: number } {
  let settle: () => void = () => undefined;
  const step = new Promise<void>((resolve) => (settle = resolve));
  const result = {
    closed: 0,
    stoppedNow: 0,
    settle: () => settle(),
    closeConnections: () => void result.closed++,
    stopNow: () => void result.stoppedNow++,
    steps: () => ({ step }),
  };
  return result;
}

function serving(shutdown: ShimShutdown, drain: DrainPlan): void {
  shutdown.restoring();
  shutdown.serving();
  shutdown.drains(drain);
}

describe("ShimShutdown", () => {
  it("drains a serving shim: shutdown signal at once, steps awaited, home watch, lock and log released, stopped", async () => {
    const { shutdown, released, msgs } = shutdownUnderTest();
    const drain = plan();
    serving(shutdown, drain);
    shutdown.request(false);
    expect(shutdown.signal.aborted).toBe(true);
    expect(shutdown.interruptSignal.aborted).toBe(false);
    expect(drain.stoppedNow).toBe(1);
    expect(shutdown.lifecycle.phase).toBe("draining");
    drain.settle();
    await shutdown.stopped;
    expect(released).toEqual(["homeWatch", "lock", "logFile"]);
    expect(shutdown.lifecycle.phase).toBe("stopped");
    expect(msgs().filter((phase) => phase !== "")).toEqual(["restoring", "serving", "draining", "stopped"]);
  });

  it("U10 interrupts at once on a second request or a forced one, and ends failed at the bound", async () => {
    const { shutdown } = shutdownUnderTest();
    const drain = plan();
    serving(shutdown, drain);
    shutdown.request(false);
    shutdown.request(true);
    expect(shutdown.interruptSignal.aborted).toBe(true);
    expect(drain.closed).toBe(1);
    await shutdown.stopped;
    expect(shutdown.lifecycle.phase).toBe("failed");
  });

  it("refuses a request before the shim serves: until then a signal stops the start", () => {
    const { shutdown } = shutdownUnderTest();
    expect(() => shutdown.request(false)).toThrow(/before the shim serves/);
  });

  it("A17 ends a start a signal interrupted as a clean stop, whatever the step in flight threw", async () => {
    const { shutdown, released } = shutdownUnderTest();
    const start = new AbortController();
    shutdown.watchStart(start.signal);
    shutdown.restoring();
    const interruption = new StartInterruptedError("SIGTERM");
    start.abort(interruption);
    expect(shutdown.signal.aborted).toBe(true);
    expect(shutdown.interruptSignal.aborted).toBe(true);
    await expect(shutdown.failStart(new Error("aborted read"))).resolves.toBe(interruption);
    expect(shutdown.lifecycle.phase).toBe("stopped");
    expect(released).toEqual(["homeWatch", "lock", "logFile"]);
  });

  it("ends a start that failed on its own as failed, with its error", async () => {
    const { shutdown } = shutdownUnderTest();
    shutdown.watchStart(new AbortController().signal);
    const error = new Error("engine unreachable");
    await expect(shutdown.failStart(error)).resolves.toBe(error);
    expect(shutdown.lifecycle.phase).toBe("failed");
  });

  it("stops listening to the start's signal once serving: a later abort is no shutdown", () => {
    const { shutdown } = shutdownUnderTest();
    const start = new AbortController();
    shutdown.watchStart(start.signal);
    serving(shutdown, plan());
    start.abort(new StartInterruptedError("SIGINT"));
    expect(shutdown.signal.aborted).toBe(false);
  });
});
