import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { Task } from "./task.js";
import { parseTaskConfig } from "./task-config.js";
import { orderedTimes, type TaskTimes } from "./task-times.js";
import { TaskStore } from "./task-store.js";

const KEYS = ["createdAt", "startedAt", "finishedAt"] as const;

/** Times around one moment, so that inversions and ties are common; absent as often as not. */
const time = fc.option(fc.integer({ min: 1_700_000_000_000, max: 1_700_000_000_020 }), { nil: undefined });
const anyTimes = fc
  .record({ createdAt: time, startedAt: time, finishedAt: time })
  .map((t) => Object.fromEntries(Object.entries(t).filter(([, v]) => v !== undefined)) as TaskTimes);

const setTimes = (t: TaskTimes): number[] =>
  KEYS.map((k) => t[k]).filter((v): v is number => v !== undefined && !Number.isNaN(v));

describe("orderedTimes", () => {
  it("puts every set time in order: created ≤ started ≤ finished", () => {
    fc.assert(
      fc.property(anyTimes, (times) => {
        const out = setTimes(orderedTimes(times));
        expect(out).toEqual([...out].sort((a, b) => a - b));
      }),
    );
  });

  it("sets exactly the times that were set, never lowers one, and raises one only to an earlier one's", () => {
    fc.assert(
      fc.property(anyTimes, (times) => {
        const out = orderedTimes(times);
        expect(Object.keys(out).sort()).toEqual(Object.keys(times).sort());
        KEYS.forEach((key, i) => {
          const before = times[key];
          const after = out[key];
          if (before === undefined || after === undefined) return;
          expect(after).toBeGreaterThanOrEqual(before);
          // Raised: to the latest of the earlier events' times, the one certain bound.
          if (after !== before) {
            const earlier = KEYS.slice(0, i).map((k) => times[k] ?? Number.NEGATIVE_INFINITY);
            expect(after).toBe(Math.max(...earlier));
          }
        });
      }),
    );
  });

  it("returns the same object when already in order, and is idempotent", () => {
    fc.assert(
      fc.property(anyTimes, (times) => {
        const once = orderedTimes(times);
        expect(orderedTimes(once)).toBe(once);
        const sorted = setTimes(times);
        if (sorted.every((v, i) => i === 0 || v >= sorted[i - 1]!)) expect(once).toBe(times);
      }),
    );
  });

  it("keeps the other fields of the object", () => {
    const task = { id: "t", createdAt: 10, startedAt: 5, finishedAt: 3, status: "terminated" };
    expect(orderedTimes(task)).toEqual({
      id: "t",
      createdAt: 10,
      startedAt: 10,
      finishedAt: 10,
      status: "terminated",
    });
    expect(task.startedAt).toBe(5);
  });

  it("a NaN time moves nothing and bounds nothing", () => {
    expect(orderedTimes({ createdAt: 5, startedAt: Number.NaN, finishedAt: 3 })).toEqual({
      createdAt: 5,
      startedAt: Number.NaN,
      finishedAt: 5,
    });
    expect(orderedTimes({ createdAt: Number.NaN, startedAt: 4, finishedAt: 3 })).toEqual({
      createdAt: Number.NaN,
      startedAt: 4,
      finishedAt: 4,
    });
  });

  it("a finish 3 s before the start (a slow start commit) is raised to the start", () => {
    expect(orderedTimes({ createdAt: 1_000, startedAt: 5_000, finishedAt: 2_000 })).toEqual({
      createdAt: 1_000,
      startedAt: 5_000,
      finishedAt: 5_000,
    });
  });
});

function makeTask(times: TaskTimes, status: Task["status"] = "creating"): Task {
  const { config } = parseTaskConfig({ id: "t1", name: "job-0-0", image_name: "debian" });
  return {
    id: "t1",
    status,
    terminationReason: status === "terminated" ? "done_by_runner" : "",
    terminationMessage: "",
    config,
    containerName: "job-0-0-t1",
    gpuIds: [],
    taskDir: "",
    cleanedUp: false,
    startInFlight: false,
    ...times,
  };
}

describe("TaskStore keeps every task's times in order", () => {
  it("on add (a restore), whatever the times given", () => {
    fc.assert(
      fc.property(anyTimes, (times) => {
        const store = new TaskStore();
        const out = setTimes(store.add(makeTask(times, "terminated")));
        expect(out).toEqual([...out].sort((a, b) => a - b));
        expect(setTimes(store.mustGet("t1"))).toEqual(out);
      }),
    );
  });

  it("on modify and preview, whatever times a change sets", () => {
    fc.assert(
      fc.property(anyTimes, anyTimes, (initial, change) => {
        const store = new TaskStore();
        store.add(makeTask(initial, "running"));
        const apply = (d: { -readonly [K in keyof TaskTimes]: TaskTimes[K] }): void => {
          Object.assign(d, change);
        };
        const preview = store.preview("t1", apply);
        const out = setTimes(store.modify("t1", apply));
        expect(out).toEqual([...out].sort((a, b) => a - b));
        expect(setTimes(preview)).toEqual(out);
      }),
    );
  });

  it("a start stamped before a finish is recorded keeps its time; a finish before it is raised", () => {
    const store = new TaskStore();
    store.add(makeTask({ createdAt: 1_000 }));
    expect(store.modify("t1", (d) => ((d.status = "running"), (d.startedAt = 5_000))).startedAt).toBe(5_000);
    const done = store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "done_by_runner";
      d.finishedAt = 2_000;
    });
    expect([done.createdAt, done.startedAt, done.finishedAt]).toEqual([1_000, 5_000, 5_000]);
  });

  it("a start time before the submit (another clock) is raised to the submit", () => {
    const store = new TaskStore();
    store.add(makeTask({ createdAt: 1_000 }));
    const running = store.modify("t1", (d) => ((d.status = "running"), (d.startedAt = 400)));
    expect([running.createdAt, running.startedAt]).toEqual([1_000, 1_000]);
  });
});
