import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { EngineIdentity } from "../docker/engine-info.js";
import { deadlineSignal } from "../exec/deadline-signal.js";
import { OperationBound } from "../exec/operation-bound.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { StorageHealth } from "../state/storage-health.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";

/*
 * Every duration and deadline is counted on the monotonic clock: a wall clock stepped an hour
 * forward must not fire one early, and one stepped an hour back must not hold it for an hour.
 * `Date` and `performance` are faked together, so `vi.setSystemTime` steps the wall clock alone
 * and `vi.advanceTimersByTime` moves both, as real time does.
 */

const HOUR = 3_600_000;
const STEPS = [
  ["forward", HOUR],
  ["back", -HOUR],
] as const;

/** Steps the (faked) wall clock by `ms` without any monotonic time passing. */
const stepWallClock = (ms: number): void => {
  vi.setSystemTime(Date.now() + ms);
};

describe.each(STEPS)("the wall clock stepped %s an hour", (_, step) => {
  describe("with fake Date and performance", () => {
    beforeEach(() => {
      vi.useFakeTimers({ toFake: ["Date", "performance", "setTimeout", "clearTimeout"] });
    });
    afterEach(() => {
      vi.useRealTimers();
    });

    it("moves no OperationBound deadline", () => {
      const bound = OperationBound.within(1_000);
      vi.advanceTimersByTime(400);
      stepWallClock(step);
      expect(bound.remainingMs()).toBe(600);
      expect(bound.elapsedMs()).toBe(400);
      expect(bound.expired()).toBe(false);
      vi.advanceTimersByTime(600);
      expect(bound.expired()).toBe(true);
      expect(bound.elapsedMs()).toBe(1_000);
    });

    it("moves no deadlineSignal", () => {
      using deadline = deadlineSignal(undefined, 1_000);
      stepWallClock(step);
      vi.advanceTimersByTime(999);
      expect(deadline.signal.aborted).toBe(false);
      vi.advanceTimersByTime(1);
      expect(deadline.signal.aborted).toBe(true);
    });

    it("moves no engine re-detection", async () => {
      let detections = 0;
      const identity = new EngineIdentity(
        {
          detectEngine: () => {
            detections++;
            return Promise.reject(new Error("GET /version: down"));
          },
        },
        { log: () => undefined },
      );
      await identity.detect();
      expect(detections).toBe(1);
      stepWallClock(step);
      identity.seen(true);
      expect(detections).toBe(1);
      vi.advanceTimersByTime(30_000);
      identity.seen(true);
      expect(detections).toBe(2);
    });
  });

  describe("on the real monotonic clock (fake Date only)", () => {
    let dir: string;
    beforeEach(async () => {
      dir = await mkdtemp(join(tmpdir(), "taskshim-clock-"));
      vi.useFakeTimers({ toFake: ["Date"], now: Date.now() });
    });
    afterEach(async () => {
      vi.useRealTimers();
      await rm(dir, { recursive: true, force: true });
    });

    it("kills a bounded command at its deadline, neither at once nor never", async () => {
      const bound = OperationBound.within(400);
      stepWallClock(step);
      const started = performance.now();
      const outcome = await new BoundedCommandRunner().run({ argv: ["sleep", "10"], bound });
      const took = performance.now() - started;
      expect(outcome.kind).toBe("expired");
      expect(took).toBeGreaterThanOrEqual(350);
      expect(took).toBeLessThan(3_000);
      if (outcome.kind === "expired") {
        expect(outcome.operationElapsedMs).toBeGreaterThanOrEqual(350);
        expect(outcome.operationElapsedMs).toBeLessThan(3_000);
      }
    });

    it("measures the storage's degraded spell, and keeps `since` on the wall clock", async () => {
      const logged: Record<string, unknown>[] = [];
      const health = new StorageHealth(dir, { log: (_level, fields) => logged.push(fields) });
      health.markFailed(Object.assign(new Error("ENOSPC: no space left on device"), { code: "ENOSPC" }));
      const degradedSince = health.state().since;
      stepWallClock(step);
      expect(await health.check()).toBe(true);
      const degradedMs = logged.find((fields) => "degradedMs" in fields)?.degradedMs;
      expect(degradedMs).toBeGreaterThanOrEqual(0);
      expect(degradedMs).toBeLessThan(60_000);
      // `since` is a timestamp users see: it follows the wall clock, step included.
      expect(health.state().since - degradedSince).toBeGreaterThanOrEqual(step);
    });
  });

  describe("the reconciler's idle probe", () => {
    let env: TestEnv;
    beforeEach(async () => {
      env = await makeContext();
      vi.useFakeTimers({ toFake: ["Date", "performance"] });
    });
    afterEach(async () => {
      vi.useRealTimers();
      await env.dispose();
    });

    it("pings every 5 s of monotonic time, whatever the wall clock did", async () => {
      await env.reconciler.tick();
      const pings = env.docker.count("ping");
      expect(pings).toBe(1);
      stepWallClock(step);
      await env.reconciler.tick();
      expect(env.docker.count("ping")).toBe(pings);
      vi.advanceTimersByTime(4_999);
      await env.reconciler.tick();
      expect(env.docker.count("ping")).toBe(pings);
      vi.advanceTimersByTime(1);
      await env.reconciler.tick();
      expect(env.docker.count("ping")).toBe(pings + 1);
    });
  });
});
