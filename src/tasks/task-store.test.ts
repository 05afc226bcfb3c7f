import { describe, expect, it } from "vitest";
import type { Task } from "./task.js";
import { parseTaskConfig } from "./task-config.js";
import { TASK_STATUSES, TransitionNotAllowedError, type TaskStatus } from "./task-status.js";
import { TaskExistsError, TaskNotFoundError, TaskStore } from "./task-store.js";

function makeTask(id: string, status: TaskStatus = "pending"): Task {
  const { config } = parseTaskConfig({ id, name: "job-0-0", image_name: "debian" });
  return {
    id,
    status,
    terminationReason: "",
    terminationMessage: "",
    config,
    containerName: `job-0-0-${id}`,
    gpuIds: [],
    taskDir: "",
    cleanedUp: false,
    startInFlight: false,
  };
}

const LIFECYCLE: readonly TaskStatus[] = ["preparing", "pulling", "creating", "running"];

function storeWith(status: TaskStatus, id = "t1"): TaskStore {
  const store = new TaskStore();
  store.add(makeTask(id, status));
  return store;
}

const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe("TaskStore: add, get, list, delete", () => {
  it("stores a copy and returns frozen snapshots", () => {
    const store = new TaskStore();
    const input = makeTask("t1") as { -readonly [K in keyof Task]: Task[K] };
    const added = store.add(input);
    input.status = "running";
    expect(store.mustGet("t1").status).toBe("pending");
    expect(added).toBe(store.get("t1"));
    expect(Object.isFrozen(added)).toBe(true);
    expect(() => {
      (added as { status: TaskStatus }).status = "running";
    }).toThrow(TypeError);
    expect(store.mustGet("t1").status).toBe("pending");
  });

  it("refuses a duplicate id", () => {
    const store = storeWith("pending");
    expect(() => store.add(makeTask("t1", "running"))).toThrow(TaskExistsError);
    expect(() => store.add(makeTask("t1"))).toThrow("task t1 is already submitted");
    expect(store.mustGet("t1").status).toBe("pending");
    expect(store.size).toBe(1);
  });

  it("get returns undefined and mustGet throws TaskNotFoundError for an unknown id", () => {
    const store = new TaskStore();
    expect(store.get("nope")).toBeUndefined();
    expect(() => store.mustGet("nope")).toThrow(TaskNotFoundError);
    expect(() => store.mustGet("nope")).toThrow("task nope: not found");
    expect(() => store.modify("nope", () => undefined)).toThrow(TaskNotFoundError);
  });

  it("lists in insertion order and forgets deleted tasks", () => {
    const store = new TaskStore();
    for (const id of ["c", "a", "b"]) store.add(makeTask(id));
    expect(store.list().map((t) => t.id)).toEqual(["c", "a", "b"]);
    store.delete("a");
    expect(store.list().map((t) => t.id)).toEqual(["c", "b"]);
    expect(store.get("a")).toBeUndefined();
    expect(store.size).toBe(2);
  });
});

describe("TaskStore.watch", () => {
  it("reports every addition, status change and removal in order, and nothing else", () => {
    const store = new TaskStore();
    const seen: string[] = [];
    const stop = store.watch((c) =>
      seen.push(`${c.kind}:${c.task.id}:${c.kind === "changed" ? c.from : ""}>${c.task.status}`),
    );
    store.add(makeTask("w1"));
    store.modify("w1", (d) => (d.status = "preparing"));
    store.modify("w1", (d) => (d.containerId = "c"));
    store.modify("w1", (d) => ((d.status = "terminated"), (d.terminationReason = "terminated_by_user")));
    store.delete("w1");
    stop();
    store.add(makeTask("w2"));
    expect(seen).toEqual([
      "added:w1:>pending",
      "changed:w1:pending>preparing",
      "changed:w1:preparing>terminated",
      "removed:w1:>terminated",
    ]);
  });
});

describe("TaskStore.generation", () => {
  it("changes with every add, modify and delete, and only then", () => {
    const store = new TaskStore();
    const seen = [store.generation];
    store.add(makeTask("t1"));
    seen.push(store.generation);
    store.modify("t1", (d) => (d.status = "preparing"));
    seen.push(store.generation);
    expect(() =>
      store.modify("t1", () => {
        throw new Error("no");
      }),
    ).toThrow("no");
    expect(() => store.modify("t1", (d) => (d.status = "pending"))).toThrow(TransitionNotAllowedError);
    store.delete("nope");
    expect(store.generation).toBe(seen.at(-1));
    store.delete("t1");
    seen.push(store.generation);
    expect(new Set(seen).size).toBe(4);
  });
});

describe("TaskStore.modify: transitions", () => {
  it("walks the whole lifecycle", () => {
    const store = storeWith("pending");
    for (const status of [...LIFECYCLE, "terminated" as const]) {
      expect(store.modify("t1", (d) => (d.status = status)).status).toBe(status);
    }
  });

  it("stamps the start and finish times once, on the change into running and terminated", () => {
    const store = storeWith("creating");
    const before = Date.now();
    const running = store.modify("t1", (d) => (d.status = "running"));
    expect(running.startedAt).toBeGreaterThanOrEqual(before);
    expect(running.finishedAt).toBeUndefined();
    expect(store.modify("t1", (d) => (d.containerId = "c")).startedAt).toBe(running.startedAt);
    const done = store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "done_by_runner";
    });
    expect(done.finishedAt).toBeGreaterThanOrEqual(running.startedAt!);
    // A finish time given by the caller (the container's own) is kept.
    const other = storeWith("running");
    expect(other.modify("t1", (d) => ((d.status = "terminated"), (d.finishedAt = 42))).finishedAt).toBe(42);
  });

  it.each(TASK_STATUSES)("allows terminated from %s", (from) => {
    const store = storeWith(from);
    const next = store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "terminated_by_user";
    });
    expect(next.status).toBe("terminated");
  });

  it.each([
    ["pending", "running"],
    ["pending", "pulling"],
    ["preparing", "creating"],
    ["pulling", "running"],
    ["running", "creating"],
    ["running", "pending"],
    ["creating", "preparing"],
    ["terminated", "running"],
    ["terminated", "pending"],
  ] as const)("rejects %s -> %s and leaves the stored task unchanged", (from, to) => {
    const store = storeWith(from);
    const before = store.mustGet("t1");
    expect(() =>
      store.modify("t1", (d) => {
        d.status = to;
        d.containerId = "should-not-stick";
      }),
    ).toThrow(TransitionNotAllowedError);
    expect(() => store.modify("t1", (d) => (d.status = to))).toThrow(
      `${from} -> ${to} transition not allowed`,
    );
    expect(store.mustGet("t1")).toBe(before);
    expect(store.mustGet("t1").containerId).toBeUndefined();
  });

  it("checks transitions only when the status changes", () => {
    for (const status of TASK_STATUSES) {
      const store = storeWith(status);
      const next = store.modify("t1", (d) => (d.ports = [{ host: 10022, container: 10022 }]));
      expect(next.status).toBe(status);
      expect(next.ports).toEqual([{ host: 10022, container: 10022 }]);
    }
  });

  it("leaves the stored task unchanged when fn throws", () => {
    const store = storeWith("running");
    const before = store.mustGet("t1");
    expect(() =>
      store.modify("t1", (d) => {
        d.containerId = "half-applied";
        throw new Error("boom");
      }),
    ).toThrow("boom");
    expect(store.mustGet("t1")).toBe(before);
  });

  it("refuses to change a task's id", () => {
    const store = storeWith("running");
    expect(() => store.modify("t1", (d) => (d.id = "t2"))).toThrow();
    expect(store.get("t2")).toBeUndefined();
    expect(store.mustGet("t1").id).toBe("t1");
  });

  it("is copy-on-write: an older snapshot stays as it was, and the new one is frozen", () => {
    const store = storeWith("creating");
    const before = store.mustGet("t1");
    const after = store.modify("t1", (d) => {
      d.status = "running";
      d.containerId = "abc";
    });
    expect(before.status).toBe("creating");
    expect(before.containerId).toBeUndefined();
    expect(after).not.toBe(before);
    expect(Object.isFrozen(after)).toBe(true);
    expect(store.mustGet("t1")).toBe(after);
  });
});

describe("TaskStore.modify: termination reasons", () => {
  function terminated(): TaskStore {
    const store = storeWith("running");
    store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "terminated_by_user";
      d.terminationMessage = "stopped from the CLI";
    });
    return store;
  }

  it("keeps the first non-empty reason and its message", () => {
    const store = terminated();
    const next = store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "done_by_runner";
      d.terminationMessage = "";
    });
    expect(next.terminationReason).toBe("terminated_by_user");
    expect(next.terminationMessage).toBe("stopped from the CLI");
  });

  it("still applies the other changes of a modify whose reason is ignored", () => {
    const store = terminated();
    const next = store.modify("t1", (d) => {
      d.terminationReason = "container_exited_with_error";
      d.terminationMessage = "exit 1";
      d.cleanedUp = true;
      d.exitCode = 137;
    });
    expect(next.cleanedUp).toBe(true);
    expect(next.exitCode).toBe(137);
    expect(next.terminationReason).toBe("terminated_by_user");
    expect(next.terminationMessage).toBe("stopped from the CLI");
  });

  it("lets a terminated task without a reason get one", () => {
    const store = storeWith("creating");
    store.modify("t1", (d) => (d.status = "terminated"));
    const next = store.modify("t1", (d) => {
      d.terminationReason = "executor_error";
      d.terminationMessage = "no capacity";
    });
    expect(next.terminationReason).toBe("executor_error");
    expect(next.terminationMessage).toBe("no capacity");
  });

  it("R12 keeps a terminate's intent on a task still running: the exit its stop causes does not replace it", () => {
    const store = storeWith("running");
    store.modify("t1", (d) => {
      d.terminationReason = "terminated_by_user";
      d.terminationMessage = "stopped by alice";
    });
    const next = store.modify("t1", (d) => {
      d.status = "terminated";
      d.terminationReason = "container_exited_with_error";
      d.terminationMessage = "Terminated";
      d.exitCode = 143;
    });
    expect([next.status, next.terminationReason, next.terminationMessage, next.exitCode]).toEqual([
      "terminated",
      "terminated_by_user",
      "stopped by alice",
      143,
    ]);
  });
});

describe("TaskStore locks", () => {
  it("tryLock returns undefined while the lock is held and succeeds after release", () => {
    const store = storeWith("running");
    const unlock = store.tryLock("t1");
    expect(unlock).toBeTypeOf("function");
    expect(store.tryLock("t1")).toBeUndefined();
    unlock?.();
    const again = store.tryLock("t1");
    expect(again).toBeTypeOf("function");
    again?.();
  });

  it("keeps one lock per task", () => {
    const store = new TaskStore();
    store.add(makeTask("a"));
    store.add(makeTask("b"));
    const a = store.tryLock("a");
    expect(a).toBeDefined();
    const b = store.tryLock("b");
    expect(b).toBeDefined();
    a?.();
    b?.();
  });

  it("lock blocks until release and then serves waiters first-in first-out", async () => {
    const store = storeWith("running");
    const holder = await store.lock("t1");
    const order: string[] = [];
    const first = store.lock("t1").then((unlock) => {
      order.push("first");
      return unlock;
    });
    const second = store.lock("t1").then((unlock) => {
      order.push("second");
      return unlock;
    });
    await settle();
    expect(order).toEqual([]);
    holder();
    expect(store.tryLock("t1")).toBeUndefined();
    (await first)();
    (await second)();
    expect(order).toEqual(["first", "second"]);
    expect(store.tryLock("t1")).toBeTypeOf("function");
  });

  it("an unlock called twice is harmless", async () => {
    const store = storeWith("running");
    const holder = await store.lock("t1");
    const waiter = store.lock("t1");
    holder();
    holder();
    const unlock = await waiter;
    expect(store.tryLock("t1")).toBeUndefined();
    unlock();
    unlock();
    expect(store.tryLock("t1")).toBeTypeOf("function");
  });

  it("withLock holds the lock while fn runs and releases it even when fn fails", async () => {
    const store = storeWith("running");
    await expect(
      store.withLock("t1", () => {
        expect(store.tryLock("t1")).toBeUndefined();
        return Promise.reject(new Error("failed inside"));
      }),
    ).rejects.toThrow("failed inside");
    const unlock = store.tryLock("t1");
    expect(unlock).toBeTypeOf("function");
    unlock?.();
    await expect(store.withLock("t1", () => Promise.resolve("value"))).resolves.toBe("value");
  });
});
