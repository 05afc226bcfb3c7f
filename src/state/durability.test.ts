import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { newTask } from "../tasks/task.js";
import { taskConfig } from "../testing/fixtures.js";
import { writeFileDurably } from "./durable-write.js";
import {
  dirSyncedAfter,
  durableReplaceViolations,
  failNextFsCall,
  fsJournal,
  resetFsJournal,
} from "../testing/fs-journal.js";
import { TaskDirs } from "./task-dirs.js";
import { readTaskState, TASK_STATE_FILE, writeTaskState } from "./task-state-file.js";

/*
 * Durability pinned where it is decided: the system calls of every write the promise rests on
 * (task.json, the task dirs; authorized_keys in host/authorized-keys.durability.test.ts), observed
 * through a journaling node:fs/promises.
 * A kill -9 never tears a write, so only these tests can see a missing fsync or rename.
 */
vi.mock("node:fs/promises", async (importOriginal) =>
  (await import("../testing/fs-journal.js")).journalingFs(await importOriginal()),
);

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "durability-"));
  resetFsJournal();
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Index of the last journal event matching. */
const lastIndex = (match: (e: (typeof fsJournal)[number]) => boolean): number =>
  fsJournal.findLastIndex(match);

describe("task.json", () => {
  it("is written to a temp file in its dir, fsynced, renamed over, and the dir fsynced", async () => {
    const task = { ...newTask(taskConfig({ id: "t1" }).config), taskDir: root, status: "running" as const };
    await writeTaskState(root, task, "boot");
    expect(durableReplaceViolations(fsJournal, join(root, TASK_STATE_FILE))).toEqual([]);
    resetFsJournal();
    // Replacing an existing file takes the same path: never an in-place rewrite.
    await writeTaskState(root, { ...task, status: "terminated" }, "boot");
    expect(durableReplaceViolations(fsJournal, join(root, TASK_STATE_FILE))).toEqual([]);
    expect(readTaskState(root).status).toBe("terminated");
    expect(await readdir(root)).toEqual([TASK_STATE_FILE]);
  });

  it("the checker itself rejects an in-place write, a missing fsync and a missing dir sync", async () => {
    // Guards the guard: what the durable write must not be is reported.
    const target = join(root, "plain.json");
    await writeFile(target, "{}");
    expect(durableReplaceViolations(fsJournal, target)).toEqual(
      expect.arrayContaining(["target opened for writing", "no rename onto the target"]),
    );
    resetFsJournal();
    const { open, rename } = await import("node:fs/promises");
    const temp = join(root, ".x.tmp");
    const handle = await open(temp, "wx");
    await handle.writeFile("x");
    await handle.close();
    await rename(temp, target);
    expect(durableReplaceViolations(fsJournal, target)).toEqual([
      "temp file not fsynced after its last write",
      `directory ${root} not fsynced after the rename`,
    ]);
  });
});

describe("writeFileDurably", () => {
  it("attempts the rename and deletes its temp file when the rename fails", async () => {
    const target = join(root, "task.json");
    await mkdir(join(target, "child"), { recursive: true });
    await expect(writeFileDurably(target, "data")).rejects.toThrow();
    const renameAt = lastIndex((e) => e.op === "rename" && e.to === target);
    expect(renameAt).toBeGreaterThan(-1);
    const temp = (fsJournal[renameAt] as { from: string }).from;
    expect(lastIndex((e) => e.op === "unlink" && e.path === temp)).toBeGreaterThan(renameAt);
    expect(await readdir(root)).toEqual(["task.json"]);
  });

  it("never renames a temp file whose write failed", async () => {
    const target = join(root, "task.json");
    await writeFile(target, "old");
    resetFsJournal();
    // A Uint8Array subclass whose bytes cannot be read fails the write itself.
    const poisoned = new Proxy(new Uint8Array(4), {
      get(t, k) {
        if (k === "buffer") throw new Error("write failed");
        return Reflect.get(t, k) as unknown;
      },
    });
    await expect(writeFileDurably(target, poisoned)).rejects.toThrow();
    expect(fsJournal.some((e) => e.op === "rename")).toBe(false);
    expect(await readFile(target, "utf8")).toBe("old");
    expect(await readdir(root)).toEqual(["task.json"]);
  });
});

describe("syncDirectory", () => {
  it("opens the directory, fsyncs it and closes it", async () => {
    const { syncDirectory } = await import("./durable-write.js");
    await syncDirectory(root);
    const opened = fsJournal.find((e) => e.op === "open" && e.path === root);
    expect(opened).toBeDefined();
    const ops = fsJournal.filter((e) => "fd" in e && e.fd === (opened as { fd: number }).fd).map((e) => e.op);
    expect(ops).toEqual(["open", "sync", "close"]);
  });
});

describe("task dirs", () => {
  it("make fsyncs the runners dir after creating the task dir", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    const created = lastIndex((e) => e.op === "mkdir" && e.path === dir);
    expect(created).toBeGreaterThan(-1);
    expect(dirSyncedAfter(fsJournal, created, dirs.root)).toBe(true);
  });

  it("remove fsyncs the runners dir after deleting the task dir", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    resetFsJournal();
    await dirs.remove(dir);
    const removed = lastIndex((e) => e.op === "rm" && e.path === dir);
    expect(removed).toBeGreaterThan(-1);
    expect(dirSyncedAfter(fsJournal, removed, dirs.root)).toBe(true);
    expect(await readdir(dirs.root)).toEqual([]);
  });

  it("remove renames a dir it cannot delete out of the way to .trash-*, then fsyncs the runners dir", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    await writeFile(join(dir, TASK_STATE_FILE), "{}");
    resetFsJournal();
    failNextFsCall("rm", dir, "EBUSY");
    const before = Date.now() * 1000;
    await dirs.remove(dir);
    const renamed = lastIndex((e) => e.op === "rename" && e.from === dir);
    expect(renamed).toBeGreaterThan(-1);
    const [trash = ""] = await readdir(dirs.root);
    expect(trash).toMatch(/^\.trash-job-1-\d+$/);
    expect(Number(trash.slice(".trash-job-1-".length))).toBeGreaterThanOrEqual(before);
    expect(await readdir(join(dirs.root, trash))).toEqual(expect.arrayContaining([TASK_STATE_FILE]));
    expect(dirSyncedAfter(fsJournal, renamed, dirs.root)).toBe(true);
    // The name is free again, and the next sweep deletes the trash.
    expect(await dirs.sweepLeftovers(new Set())).toEqual([join(dirs.root, trash)]);
  });

  it("remove gives up quietly when neither the delete nor the rename works", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    failNextFsCall("rm", dir, "EBUSY");
    failNextFsCall("rename", dir, "EBUSY");
    await expect(dirs.remove(dir)).resolves.toBeUndefined();
    expect(await readdir(dirs.root)).toEqual(["job-1"]);
  });

  it("quarantine moves task.json to <home>/quarantine and fsyncs the task dir and the quarantine", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    await writeFile(join(dir, TASK_STATE_FILE), "not json");
    resetFsJournal();
    const aside = await dirs.quarantine(dir, "task state is not valid JSON");
    expect(aside.startsWith(join(root, "quarantine") + "/")).toBe(true);
    const renamed = lastIndex((e) => e.op === "rename" && e.to === aside);
    expect(renamed).toBeGreaterThan(-1);
    expect(dirSyncedAfter(fsJournal, renamed, dir)).toBe(true);
    expect(dirSyncedAfter(fsJournal, renamed, join(root, "quarantine"))).toBe(true);
  });

  it("a sweep fsyncs the runners dir after deleting leftovers", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    resetFsJournal();
    expect(await dirs.sweepLeftovers(new Set())).toEqual([dir]);
    const removed = lastIndex((e) => e.op === "rm" && e.path === dir);
    expect(dirSyncedAfter(fsJournal, removed, dirs.root)).toBe(true);
  });

  it("S15 a quarantine whose move fails leaves the file and no note, and claims nothing", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    await writeFile(join(dir, TASK_STATE_FILE), "not json");
    failNextFsCall("rename", join(dir, TASK_STATE_FILE), "EXDEV");
    await expect(dirs.quarantine(dir, "task state is not valid JSON")).rejects.toThrow(
      /cannot move .* to .*quarantine: cannot move it: EXDEV/,
    );
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe("not json");
    expect(await readdir(join(root, "quarantine"))).toEqual([]);
  });

  it("S12 a wide task dir the home will not let be narrowed (read-only): the scan goes on and says why", async () => {
    const dirs = new TaskDirs(root);
    const dir = await dirs.make("job-1");
    await writeTaskState(
      dir,
      { ...newTask(taskConfig({ id: "t-1", name: "job" }).config), taskDir: dir },
      "boot",
    );
    await chmod(dir, 0o755);
    failNextFsCall("chmod", dir, "EROFS");
    const [entry] = await dirs.scan();
    expect(entry).toMatchObject({ kind: "state", narrowedFrom: 0o755, narrowError: "EROFS: injected" });
  });
});
