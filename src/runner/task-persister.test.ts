import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { readTaskState } from "../state/task-state-file.js";
import { newTask } from "../tasks/task.js";
import { TaskStore } from "../tasks/task-store.js";
import { taskConfig } from "../testing/fixtures.js";
import { StorageHealth } from "../state/storage-health.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { TaskPersistError, TaskPersister } from "./task-persister.js";

let dir: string;
let store: TaskStore;
let persister: TaskPersister;
/** The status of every task.json write, in the order they started. */
const written = vi.hoisted(() => [] as string[]);
/** Writes hold here while a test keeps it closed; how many overlap is recorded. */
const io = vi.hoisted(() => ({
  gate: undefined as Promise<void> | undefined,
  inFlight: 0,
  maxInFlight: 0,
  /** The next write fails with this (before touching the file). */
  fail: undefined as Error | undefined,
}));
vi.mock("../state/task-state-file.js", async (importOriginal) => {
  const real = await importOriginal<typeof import("../state/task-state-file.js")>();
  return {
    ...real,
    writeTaskState: async (...args: Parameters<typeof real.writeTaskState>) => {
      written.push(args[1].status);
      const fail = io.fail;
      io.fail = undefined;
      if (fail) throw fail;
      io.maxInFlight = Math.max(io.maxInFlight, ++io.inFlight);
      try {
        // The task is encoded as the write saw it when it started, like the real write.
        const gate = io.gate;
        io.gate = undefined;
        if (gate) await gate;
        await real.writeTaskState(...args);
      } finally {
        io.inFlight--;
      }
    },
  };
});

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-persister-"));
  store = new TaskStore();
  store.add({ ...newTask(taskConfig({ id: "t1" }).config), taskDir: dir });
  persister = new TaskPersister(store, "boot-1", pino({ level: "silent" }));
  written.length = 0;
  Object.assign(io, { gate: undefined, inFlight: 0, maxInFlight: 0, fail: undefined });
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("TaskPersister", () => {
  it("writes the task as it is when the write runs, sharing a write already queued", async () => {
    store.modify("t1", (d) => (d.status = "preparing"));
    const first = persister.persist("t1");
    await vi.waitFor(() => expect(written).toEqual(["preparing"]));
    store.modify("t1", (d) => (d.status = "pulling"));
    const second = persister.persist("t1");
    store.modify("t1", (d) => (d.status = "creating"));
    const third = persister.persist("t1");
    expect(third).toBe(second);
    expect(second).not.toBe(first);
    await Promise.all([first, second, third]);
    expect(written).toEqual(["preparing", "creating"]);
    expect(readTaskState(dir).status).toBe("creating");
  });

  it("rejects with TaskPersistError when the write fails, and the next write runs again", async () => {
    await rm(dir, { recursive: true, force: true });
    await expect(persister.persist("t1")).rejects.toThrow(/failed to persist state of task t1/);
    await mkdir(dir);
    await persister.persist("t1");
    expect(readTaskState(dir).status).toBe("pending");
  });

  it("never lets a slow earlier write land after a newer one", async () => {
    let open!: () => void;
    io.gate = new Promise<void>((resolve) => (open = resolve));
    store.modify("t1", (d) => (d.status = "preparing"));
    const slow = persister.persist("t1");
    await vi.waitFor(() => expect(written).toEqual(["preparing"]));
    store.modify("t1", (d) => (d.status = "pulling"));
    const newer = persister.persist("t1");
    // The newer write waits for the slow one instead of racing it.
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(written).toEqual(["preparing"]);
    open();
    await Promise.all([slow, newer]);
    expect(written).toEqual(["preparing", "pulling"]);
    expect(io.maxInFlight).toBe(1);
    expect(readTaskState(dir).status).toBe("pulling");
  });

  it("orders writes per task only: another task's write does not wait", async () => {
    const other = await mkdtemp(join(tmpdir(), "taskshim-persister-"));
    try {
      store.add({ ...newTask(taskConfig({ id: "t2" }).config), taskDir: other });
      let open!: () => void;
      io.gate = new Promise<void>((resolve) => (open = resolve));
      const slow = persister.persist("t1");
      await persister.persist("t2");
      expect(readTaskState(other).id).toBe("t2");
      open();
      await slow;
      await persister.settle("t1");
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });

  it("settle waits for the write in flight", async () => {
    let open!: () => void;
    io.gate = new Promise<void>((resolve) => (open = resolve));
    void persister.persist("t1");
    let settled = false;
    const settling = persister.settle("t1").then(() => (settled = true));
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(settled).toBe(false);
    open();
    await settling;
    expect(readTaskState(dir).status).toBe("pending");
  });
});

function errno(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: simulated, write`), { code });
}

describe("TaskPersister: a failed write", () => {
  it("rejects with a named TaskPersistError carrying the cause, logs it, and remembers the task as unsynced", async () => {
    const { log, lines } = capturingLogger();
    const p = new TaskPersister(store, "boot-1", log);
    const cause = errno("EIO");
    io.fail = cause;
    const error = (await p.persist("t1").catch((e: unknown) => e)) as TaskPersistError;
    expect(error).toBeInstanceOf(TaskPersistError);
    expect(error.name).toBe("TaskPersistError");
    expect(error.message).toBe("failed to persist state of task t1: EIO: simulated, write");
    expect(error.cause).toBe(cause);
    expect(p.unsyncedIds()).toEqual(["t1"]);
    const failed = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(failed).toEqual([
      expect.objectContaining({ level: 50, taskId: "t1", msg: "failed to persist task state" }),
    ]);
    expect(failed[0]?.err).toMatchObject({ message: "EIO: simulated, write" });
    // The next successful write makes it durable again.
    await p.persist("t1");
    expect(p.unsyncedIds()).toEqual([]);
  });

  it("marks the home degraded on a storage error only", async () => {
    const health = new StorageHealth(dir);
    const p = new TaskPersister(store, "boot-1", pino({ level: "silent" }), health);
    io.fail = new Error("a bug, not the disk");
    await expect(p.persist("t1")).rejects.toThrow(TaskPersistError);
    expect(health.state().state).toBe("ok");
    io.fail = errno("ENOSPC");
    await expect(p.persist("t1")).rejects.toThrow(TaskPersistError);
    expect(health.state()).toMatchObject({ state: "degraded", error: "ENOSPC: simulated" });
  });

  it("settle resolves after a failed write instead of rejecting", async () => {
    io.fail = errno("EIO");
    const failing = persister.persist("t1").catch(() => undefined);
    await expect(persister.settle("t1")).resolves.toBeUndefined();
    await failing;
  });

  it("a failed write does not block the next one queued behind it", async () => {
    let open!: () => void;
    io.gate = new Promise<void>((resolve) => (open = resolve));
    const first = persister.persist("t1");
    await vi.waitFor(() => expect(written).toHaveLength(1));
    io.fail = errno("EIO");
    const second = persister.persist("t1").catch((e: unknown) => e);
    store.modify("t1", (d) => (d.status = "preparing"));
    open();
    await first;
    expect(await second).toBeInstanceOf(TaskPersistError);
    await persister.persist("t1");
    expect(readTaskState(dir).status).toBe("preparing");
  });
});

describe("TaskPersister: what is not written", () => {
  it("skips a task deleted before its write and forgets that it was unsynced", async () => {
    io.fail = errno("EIO");
    await expect(persister.persist("t1")).rejects.toThrow(TaskPersistError);
    expect(persister.unsyncedIds()).toEqual(["t1"]);
    store.delete("t1");
    // Deleted: not listed as unsynced, and its persist writes nothing.
    expect(persister.unsyncedIds()).toEqual([]);
    await persister.persist("t1");
    expect(written).toHaveLength(1);
    // A new task under the same id does not inherit the old one's unsynced mark.
    store.add({ ...newTask(taskConfig({ id: "t1" }).config), taskDir: dir });
    expect(persister.unsyncedIds()).toEqual([]);
  });

  it.each([
    ["without a task dir (a task not created on disk)", { taskDir: "" }],
    ["held by a newer release", { held: { kind: "newer-format", version: 2 } }],
    [
      "whose unreadable state file could not be quarantined",
      { held: { kind: "unquarantined", reason: "x" } },
    ],
  ])("writes nothing for a task %s, and does not count it unsynced", async (_label, fields) => {
    io.fail = errno("EIO");
    await expect(persister.persist("t1")).rejects.toThrow(TaskPersistError);
    store.modify("t1", (d) => Object.assign(d, fields));
    await persister.persist("t1");
    expect(written).toHaveLength(1);
    expect(persister.unsyncedIds()).toEqual([]);
    expect(await persister.flush()).toBe(true);
    expect(written).toHaveLength(1);
  });

  it("forget drops a task from the unsynced ones", async () => {
    io.fail = errno("EIO");
    await expect(persister.persist("t1")).rejects.toThrow(TaskPersistError);
    persister.forget("t1");
    expect(persister.unsyncedIds()).toEqual([]);
    expect(await persister.flush()).toBe(true);
    expect(written).toHaveLength(1);
  });
});

describe("TaskPersister.flush", () => {
  it("writes every unsynced task again: true once all are on disk, false while one still fails", async () => {
    const other = await mkdtemp(join(tmpdir(), "taskshim-persister-"));
    try {
      store.add({ ...newTask(taskConfig({ id: "t2" }).config), taskDir: other });
      io.fail = errno("ENOSPC");
      await expect(persister.persist("t1")).rejects.toThrow(TaskPersistError);
      io.fail = errno("ENOSPC");
      await expect(persister.persist("t2")).rejects.toThrow(TaskPersistError);
      expect(persister.unsyncedIds()).toEqual(["t1", "t2"]);
      written.length = 0;
      io.fail = errno("ENOSPC");
      expect(await persister.flush()).toBe(false);
      expect(written).toHaveLength(2);
      expect(persister.unsyncedIds()).toHaveLength(1);
      expect(await persister.flush()).toBe(true);
      expect(persister.unsyncedIds()).toEqual([]);
      expect(readTaskState(dir).id).toBe("t1");
      expect(readTaskState(other).id).toBe("t2");
      // Nothing unsynced: nothing written.
      written.length = 0;
      expect(await persister.flush()).toBe(true);
      expect(written).toEqual([]);
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });
});

describe("TaskPersister.persistChange", () => {
  it("writes the changed task first and stores it only then, with the written times", async () => {
    const now = vi.spyOn(Date, "now");
    try {
      let t = 1_700_000_000_000;
      now.mockImplementation(() => (t += 1_000));
      const next = await persister.persistChange("t1", (d) => {
        d.status = "terminated";
        d.terminationReason = "terminated_by_user";
      });
      expect(next).toBe(store.mustGet("t1"));
      expect(next).toMatchObject({ status: "terminated", terminationReason: "terminated_by_user" });
      const onDisk = readTaskState(dir);
      expect(onDisk.status).toBe("terminated");
      // The store would stamp a new (later) time when applying; memory keeps the file's.
      expect(next.finishedAt).toBeDefined();
      expect(onDisk.finished_at).toBe(new Date(next.finishedAt!).toISOString());
    } finally {
      now.mockRestore();
    }
  });

  it("keeps the written start time of a task that starts running", async () => {
    store.modify("t1", (d) => (d.status = "preparing"));
    store.modify("t1", (d) => (d.status = "pulling"));
    store.modify("t1", (d) => (d.status = "creating"));
    const now = vi.spyOn(Date, "now");
    try {
      let t = 1_700_000_000_000;
      now.mockImplementation(() => (t += 1_000));
      const next = await persister.persistChange("t1", (d) => (d.status = "running"));
      expect(next.startedAt).toBeDefined();
      expect(readTaskState(dir).started_at).toBe(new Date(next.startedAt!).toISOString());
      expect(next.finishedAt).toBeUndefined();
    } finally {
      now.mockRestore();
    }
  });

  it("on a failed write changes nothing in memory, rejects, and leaves the task unsynced", async () => {
    const before = store.mustGet("t1");
    io.fail = errno("EROFS");
    await expect(persister.persistChange("t1", (d) => (d.status = "terminated"))).rejects.toThrow(
      TaskPersistError,
    );
    expect(store.mustGet("t1")).toBe(before);
    expect(written).toEqual(["terminated"]);
    expect(persister.unsyncedIds()).toEqual(["t1"]);
  });

  it("a persist requested after the change carries it (not a write queued before it)", async () => {
    let open!: () => void;
    io.gate = new Promise<void>((resolve) => (open = resolve));
    const inFlight = persister.persist("t1");
    await vi.waitFor(() => expect(written).toHaveLength(1));
    const queuedBefore = persister.persist("t1");
    const change = persister.persistChange("t1", (d) => (d.status = "preparing"));
    const after = persister.persist("t1");
    expect(after).not.toBe(queuedBefore);
    open();
    await after;
    // Resolved only once the change itself is on disk.
    expect(store.mustGet("t1").status).toBe("preparing");
    expect(readTaskState(dir).status).toBe("preparing");
    await Promise.all([inFlight, queuedBefore, change]);
    expect(written).toEqual(["pending", "pending", "preparing", "preparing"]);
  });
});

describe("TaskPersister: its per-task write chains", () => {
  it("forgets a task's chain once its last write settled, failed or not", async () => {
    const chains = (persister as unknown as { chains: Map<string, Promise<void>> }).chains;
    await persister.persist("t1");
    await vi.waitFor(() => expect(chains.size).toBe(0));
    io.fail = errno("EIO");
    await expect(persister.persist("t1")).rejects.toThrow(TaskPersistError);
    await vi.waitFor(() => expect(chains.size).toBe(0));
  });

  it("keeps the chain of a newer write when an older one settles", async () => {
    const chains = (persister as unknown as { chains: Map<string, Promise<void>> }).chains;
    let openFirst!: () => void;
    io.gate = new Promise<void>((resolve) => (openFirst = resolve));
    const first = persister.persist("t1");
    await vi.waitFor(() => expect(written).toHaveLength(1));
    const second = persister.persist("t1");
    let openSecond!: () => void;
    io.gate = new Promise<void>((resolve) => (openSecond = resolve));
    openFirst();
    await first;
    await vi.waitFor(() => expect(written).toHaveLength(2));
    // The second write is in flight: settle() must still find it.
    expect(chains.has("t1")).toBe(true);
    openSecond();
    await second;
  });
});
