import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { readTaskState } from "../state/task-state-file.js";
import { newTask } from "../tasks/task.js";
import { TaskStore } from "../tasks/task-store.js";
import { TaskPersister } from "./task-persister.js";
import { taskConfig } from "./test-support.js";

let dir: string;
let store: TaskStore;
let persister: TaskPersister;
/** The status of every task.json write, in the order they started. */
const written = vi.hoisted(() => [] as string[]);
vi.mock("../state/task-state-file.js", async (importOriginal) => {
  const real = await importOriginal<typeof import("../state/task-state-file.js")>();
  return {
    ...real,
    writeTaskState: (...args: Parameters<typeof real.writeTaskState>) => {
      written.push(args[1].status);
      return real.writeTaskState(...args);
    },
  };
});

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-persister-"));
  store = new TaskStore();
  store.add({ ...newTask(taskConfig({ id: "t1" }).config), taskDir: dir });
  persister = new TaskPersister(store, "boot-1", pino({ level: "silent" }));
  written.length = 0;
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
});
