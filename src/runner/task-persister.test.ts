import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { readTaskState } from "../state/task-state-file.js";
import { newTask } from "../tasks/task.js";
import { TaskStore } from "../tasks/task-store.js";
import { taskConfig } from "../testing/fixtures.js";
import { TaskPersister } from "./task-persister.js";

let dir: string;
let store: TaskStore;
let persister: TaskPersister;
/** The status of every task.json write, in the order they started. */
const written = vi.hoisted(() => [] as string[]);
/** Writes hold here while a test keeps it closed; how many overlap is recorded. */
const io = vi.hoisted(() => ({ gate: undefined as Promise<void> | undefined, inFlight: 0, maxInFlight: 0 }));
vi.mock("../state/task-state-file.js", async (importOriginal) => {
  const real = await importOriginal<typeof import("../state/task-state-file.js")>();
  return {
    ...real,
    writeTaskState: async (...args: Parameters<typeof real.writeTaskState>) => {
      written.push(args[1].status);
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
  Object.assign(io, { gate: undefined, inFlight: 0, maxInFlight: 0 });
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
    expect((await readTaskState(dir)).status).toBe("creating");
  });

  it("rejects with TaskPersistError when the write fails, and the next write runs again", async () => {
    await rm(dir, { recursive: true, force: true });
    await expect(persister.persist("t1")).rejects.toThrow(/failed to persist state of task t1/);
    await mkdir(dir);
    await persister.persist("t1");
    expect((await readTaskState(dir)).status).toBe("pending");
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
    expect((await readTaskState(dir)).status).toBe("pulling");
  });

  it("orders writes per task only: another task's write does not wait", async () => {
    const other = await mkdtemp(join(tmpdir(), "taskshim-persister-"));
    try {
      store.add({ ...newTask(taskConfig({ id: "t2" }).config), taskDir: other });
      let open!: () => void;
      io.gate = new Promise<void>((resolve) => (open = resolve));
      const slow = persister.persist("t1");
      await persister.persist("t2");
      expect((await readTaskState(other)).id).toBe("t2");
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
    expect((await readTaskState(dir)).status).toBe("pending");
  });
});
