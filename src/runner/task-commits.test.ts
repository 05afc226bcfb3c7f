/*
 * The one writer's modes. Under storage faults: a change of the shim's own steps stays in memory
 * and is written when storage is back; one a request asks for changes nothing unless durable.
 * Then what each mode leaves in memory and on disk where a crash could cut it.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { StorageUnavailableError } from "../state/storage-health.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import type { TestEnv } from "../testing/test-context.js";
import { loggedAs, useRunnerEnv } from "../testing/runner-env.js";
import { armFailpoints } from "./failpoints.js";
import { REGISTRY_AUTH_FILE, writeRegistryAuth } from "./registry-auth-file.js";
import { TaskCommits } from "./task-commits.js";

let env: TestEnv;
let lines: string[];
useRunnerEnv((current) => ({ env, lines } = current));
const logged = (msg: string): Record<string, unknown>[] => loggedAs(lines, msg);
const onDisk = (taskDir: string): Record<string, unknown> =>
  JSON.parse(readFileSync(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;

describe("TaskRunner.commit under storage faults", () => {
  it("keeps a change in memory when the home cannot take it, and warns", async () => {
    const { task } = await env.seedTask();
    armFailpoints("durable-write:task-state=1*error(ENOSPC)");
    const after = await env.runner.commit(task.id, (d) => (d.exitCode = 3));
    expect(after.exitCode).toBe(3);
    expect(env.ctx.store.mustGet(task.id).exitCode).toBe(3);
    expect(logged("task state not yet durable; written when storage is back")).toMatchObject([
      { taskId: task.id, status: "running" },
    ]);
  });

  it("throws any other failure of the write", async () => {
    const { task } = await env.seedTask();
    armFailpoints("durable-write:task-state=1*error(boom)");
    await expect(env.runner.commit(task.id, (d) => (d.exitCode = 3))).rejects.toThrow(
      /failpoint durable-write:task-state: boom/,
    );
  });

  it("commitVisibleWhenDurable makes the change in memory all the same on a storage fault", async () => {
    const { task } = await env.seedTask({ status: "creating", containerState: "created" });
    armFailpoints("durable-write:task-state=1*error(ENOSPC)");
    const after = await env.runner.commitVisibleWhenDurable(task.id, (d) => (d.status = "running"));
    expect(after.status).toBe("running");
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    expect(logged("task state not yet durable; written when storage is back")).toMatchObject([
      { taskId: task.id, status: "running" },
    ]);
  });

  it("commitVisibleWhenDurable throws any other failure and changes nothing", async () => {
    const { task } = await env.seedTask({ status: "creating", containerState: "created" });
    armFailpoints("durable-write:task-state=1*error(boom)");
    await expect(env.runner.commitVisibleWhenDurable(task.id, (d) => (d.status = "running"))).rejects.toThrow(
      /failpoint durable-write:task-state: boom/,
    );
    expect(env.ctx.store.mustGet(task.id).status).toBe("creating");
  });

  it("fires after-state:<status> only when the status changed", async () => {
    const { task } = await env.seedTask();
    armFailpoints("after-state:running=error(boom),after-state:terminated=error(bang)");
    await env.runner.commit(task.id, (d) => (d.exitCode = 1));
    await env.runner.commitVisibleWhenDurable(task.id, (d) => (d.exitCode = 2));
    await expect(env.runner.commit(task.id, (d) => (d.status = "terminated"))).rejects.toThrow(
      "failpoint after-state:terminated: bang",
    );
  });

  it("commitVisibleWhenDurable fires after-state:<status> on a change", async () => {
    const { task } = await env.seedTask({ status: "creating", containerState: "created" });
    armFailpoints("after-state:running=error(boom)");
    await expect(env.runner.commitVisibleWhenDurable(task.id, (d) => (d.status = "running"))).rejects.toThrow(
      "failpoint after-state:running: boom",
    );
  });

  it("a terminate whose intent fails to write for another reason is not a storage fault", async () => {
    const { task } = await env.seedTask();
    armFailpoints("durable-write:task-state=1*error(boom)");
    const error = await env.runner.terminate(task.id, 0, "terminated_by_user", "").catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(StorageUnavailableError);
    expect((error as Error).message).toMatch(/failpoint durable-write:task-state: boom/);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });
});

describe("TaskRunner.catchUpStorage", () => {
  it("deletes the credentials of running and terminated tasks only, never a held task's", async () => {
    const auth = { username: "u", password: "p" };
    const { task: running } = await env.seedTask({ status: "running" });
    const { task: terminated } = await env.seedTask({ status: "terminated", containerState: "exited" });
    const { task: pulling } = await env.seedTask({ status: "pulling", containerState: "none" });
    const { task: foreign } = await env.seedTask({ status: "terminated", containerState: "exited" });
    env.ctx.store.modify(foreign.id, (d) => (d.held = { kind: "newer-format", version: 2 }));
    for (const t of [running, terminated, pulling, foreign]) await writeRegistryAuth(t.taskDir, auth);
    expect(await env.runner.catchUpStorage()).toBe(true);
    const has = (dir: string): boolean => existsSync(join(dir, REGISTRY_AUTH_FILE));
    expect(has(running.taskDir)).toBe(false);
    expect(has(terminated.taskDir)).toBe(false);
    expect(has(pulling.taskDir)).toBe(true);
    expect(has(foreign.taskDir)).toBe(true);
  });
});

// What each mode leaves on disk and in memory at the point a crash could cut it.
describe("TaskCommits modes", () => {
  it("commitInBackground changes memory at once and writes without being awaited; a failed write is not thrown", async () => {
    const { task } = await env.seedTask({ status: "pending", containerState: "none" });
    const commits = new TaskCommits(env.ctx);
    const shown = commits.commitInBackground(task.id, (d) => (d.status = "preparing"));
    expect(shown.status).toBe("preparing");
    expect(onDisk(task.taskDir)).toMatchObject({ status: "pending" });
    await commits.persister.settle(task.id);
    expect(onDisk(task.taskDir)).toMatchObject({ status: "preparing" });

    armFailpoints("durable-write:task-state=1*error(ENOSPC)");
    commits.commitInBackground(task.id, (d) => (d.status = "pulling"));
    await commits.persister.settle(task.id);
    expect(env.ctx.store.mustGet(task.id).status).toBe("pulling");
    expect(commits.persister.unsyncedIds()).toEqual([task.id]);
    // The task's next write carries it.
    await commits.commit(task.id, (d) => (d.status = "creating"));
    expect(onDisk(task.taskDir)).toMatchObject({ status: "creating" });
    expect(commits.persister.unsyncedIds()).toEqual([]);
  });

  it("inMemoryOnly and markCleanedUp write nothing: the task's next write carries them", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited" });
    const commits = new TaskCommits(env.ctx);
    commits.inMemoryOnly(task.id, (d) => (d.exitCode = 7));
    expect(commits.markCleanedUp(task.id)).toMatchObject({ cleanedUp: true, exitCode: 7 });
    await commits.persister.settle(task.id);
    expect(onDisk(task.taskDir)).toMatchObject({ cleaned_up: false });
    expect(onDisk(task.taskDir)).not.toHaveProperty("exit_code");
    await commits.commit(task.id, (d) => (d.gpuIds = []));
    expect(onDisk(task.taskDir)).toMatchObject({ cleaned_up: true, exit_code: 7 });
  });

  it("writeRestored writes the task as memory has it, and leaves a storage failure not yet durable", async () => {
    const { task } = await env.seedTask();
    const commits = new TaskCommits(env.ctx);
    commits.inMemoryOnly(task.id, (d) => (d.exitCode = 2));
    await commits.writeRestored(task.id);
    expect(onDisk(task.taskDir)).toMatchObject({ exit_code: 2 });
    armFailpoints("durable-write:task-state=1*error(EROFS)");
    commits.inMemoryOnly(task.id, (d) => (d.exitCode = 3));
    await expect(commits.writeRestored(task.id)).resolves.toBeUndefined();
    expect(commits.persister.unsyncedIds()).toEqual([task.id]);
    expect(onDisk(task.taskDir)).toMatchObject({ exit_code: 2 });
  });

  it("createDurably keeps nothing of a task whose files fail, and says when storage is the cause", async () => {
    const { task: model } = await env.seedTask({ status: "pending", containerState: "none" });
    const commits = new TaskCommits(env.ctx);
    const fresh = { ...model, id: "fresh-task", containerName: "fresh-task-0000", taskDir: "" };
    let undone = 0;
    const failing = (error: Error) => ({
      write: () => Promise.reject(error),
      undo: () => Promise.resolve(void undone++),
    });
    const enospc = Object.assign(new Error("disk full"), { code: "ENOSPC" });
    await expect(commits.createDurably(fresh, failing(enospc))).rejects.toBeInstanceOf(
      StorageUnavailableError,
    );
    expect(env.ctx.store.get(fresh.id)).toBeUndefined();
    await expect(commits.createDurably(fresh, failing(new Error("boom")))).rejects.toThrow(
      "failed to create task fresh-task: boom",
    );
    expect(env.ctx.store.get(fresh.id)).toBeUndefined();
    expect(undone).toBe(2);
  });
});
