import { existsSync, readFileSync } from "node:fs";
import { mkdir, readdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { StorageUnavailableError } from "../state/storage-health.js";
import { encodeTaskState, TASK_STATE_FILE } from "../state/task-state-file.js";
import { newTask } from "../tasks/task.js";
import { containerNameFor } from "../tasks/container-name.js";
import { taskConfig } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { armFailpoints } from "./failpoints.js";
import { REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import { restoreTasks } from "./restore.js";

/*
 * Storage faults with the fake engine: the failpoints' `error(ENOSPC)` / `error(EIO)` action at
 * the durable writes stands for a full or failing disk (the docker-backed test/storage-faults
 * test runs the real ones: tmpfs, ext4 loop mounts, chattr, remount ro).
 */

let env: TestEnv;
beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  armFailpoints(undefined);
  await env.dispose();
});

const readState = (taskDir: string): Record<string, unknown> =>
  JSON.parse(readFileSync(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;

const runnersDir = (): string => join(env.home, "runners");
const taskDirs = async (): Promise<string[]> =>
  (await readdir(runnersDir()).catch(() => [] as string[])).filter((n) => !n.startsWith("."));

describe("submit while storage cannot take the write", () => {
  it.each([
    ["task.json", "durable-write:task-state=1*error(ENOSPC)", "ENOSPC"],
    ["the task dir", "durable-write:task-dir=1*error(EROFS)", "EROFS"],
    ["the credentials", "durable-write:registry-auth=1*error(EIO)", "EIO"],
  ])(
    "fails at %s with a storage error and leaves nothing; a retry is a fresh submit",
    async (_, spec, code) => {
      const { config, auth } = taskConfig({ registry_username: "u", registry_password: "p" });
      armFailpoints(spec);
      const error = await env.runner.submit(config, auth).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(StorageUnavailableError);
      expect((error as Error).message).toMatch(new RegExp(`^storage unavailable: ${code}: `));
      expect(env.ctx.store.get(config.id)).toBeUndefined();
      expect(await taskDirs()).toEqual([]);
      expect(env.ctx.storage?.state()).toMatchObject({
        state: "degraded",
        error: expect.stringMatching(code) as unknown,
      });

      const task = await env.runner.submit(config, auth);
      expect(task.status).toBe("pending");
      expect(readState(task.taskDir)).toMatchObject({ id: config.id, status: "pending" });
      await env.runner.awaitStarts();
    },
  );

  it("deletes credentials an earlier attempt left in the dir when the retry brings none", async () => {
    const { config, auth } = taskConfig();
    const dir = join(runnersDir(), containerNameFor(config.name, config.id));
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, REGISTRY_AUTH_FILE), JSON.stringify({ username: "old", password: "old" }));
    const task = await env.runner.submit(config, auth);
    expect(existsSync(join(task.taskDir, REGISTRY_AUTH_FILE))).toBe(false);
    await env.runner.awaitStarts();
    const pulls = env.docker.callsOf("pullImage");
    expect(pulls.length).toBeGreaterThan(0);
    expect(pulls.every((call) => call.args[1] === undefined)).toBe(true);
  });
});

describe("terminate and remove whose intent cannot be persisted", () => {
  it("terminate answers a storage error and changes nothing: memory, disk, container", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    armFailpoints("durable-write:task-state=1*error(ENOSPC)");
    await expect(env.runner.terminate(task.id, 0, "terminated_by_user", "")).rejects.toBeInstanceOf(
      StorageUnavailableError,
    );
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", terminationReason: "" });
    expect(readState(task.taskDir)).toMatchObject({ status: "running", termination_reason: "" });
    expect(env.docker.count("stopContainer")).toBe(0);
    // The reconciler has nothing to act on: the container keeps running.
    await env.reconciler.tick();
    expect(env.docker.mustFind(task.containerId!).state).toBe("running");
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);

    const after = await env.runner.terminate(task.id, 0, "terminated_by_user", "later");
    expect(after).toMatchObject({ status: "terminated", terminationReason: "terminated_by_user" });
    expect(readState(task.taskDir)).toMatchObject({
      status: "terminated",
      termination_reason: "terminated_by_user",
    });
  });

  it("remove answers a storage error before touching the container", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    armFailpoints("durable-write:task-state=1*error(EROFS)");
    await expect(env.runner.remove(task.id)).rejects.toBeInstanceOf(StorageUnavailableError);
    expect(env.docker.count("removeContainer")).toBe(0);
    expect(env.ctx.store.get(task.id)).toBeDefined();
    expect(existsSync(task.taskDir)).toBe(true);
    await env.runner.remove(task.id);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
    expect(existsSync(task.taskDir)).toBe(false);
  });
});

describe("exits while storage is degraded", () => {
  it("are final in memory at once, written when storage is back, and released once", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    const release = vi.spyOn(env.ctx.gpuLock, "release");
    armFailpoints("durable-write:task-state=error(EIO)");
    env.docker.exit(task.containerId!, 3, { logs: ["boom"] });
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "container_exited_with_error",
      exitCode: 3,
      cleanedUp: true,
    });
    expect(readState(task.taskDir)).toMatchObject({ status: "running" });
    expect(env.runner.persister.unsyncedIds()).toEqual([task.id]);
    expect(env.ctx.storage?.degraded).toBe(true);
    await env.reconciler.tick();

    // Still failing: the probe passes (it is not behind the failpoint) but the catch-up does not.
    expect(await env.runner.catchUpStorage()).toBe(false);
    armFailpoints(undefined);
    expect(await env.runner.catchUpStorage()).toBe(true);
    expect(readState(task.taskDir)).toMatchObject({
      status: "terminated",
      termination_reason: "container_exited_with_error",
      exit_code: 3,
      cleaned_up: true,
    });
    expect(env.runner.persister.unsyncedIds()).toEqual([]);
    expect(release.mock.calls.filter(([ids]) => ids.length > 0)).toHaveLength(1);
  });

  it("a start whose writes fail still runs its container; task.json follows once storage is back", async () => {
    const task = await env.submit();
    armFailpoints("durable-write:task-state=error(ENOSPC)");
    await env.runner.awaitStarts();
    const running = env.ctx.store.mustGet(task.id);
    expect(running.status).toBe("running");
    expect(env.docker.mustFind(running.containerId!).state).toBe("running");
    expect(readState(task.taskDir).status).toBe("pending");
    armFailpoints(undefined);
    expect(await env.runner.catchUpStorage()).toBe(true);
    expect(readState(task.taskDir).status).toBe("running");
  });

  it("the health probe clears the degraded state only after the catch-up wrote everything", async () => {
    const task = await env.submitAndStart();
    armFailpoints("durable-write:task-state=error(ENOSPC)");
    env.docker.exit(task.containerId!, 0);
    await env.reconciler.tick();
    expect(env.ctx.storage?.degraded).toBe(true);
    armFailpoints(undefined);
    // makeContext's health has no catch-up hook: wire the runner's, as serve does.
    const { StorageHealth } = await import("../state/storage-health.js");
    const health = new StorageHealth(runnersDir(), { catchUp: () => env.runner.catchUpStorage() });
    health.markFailed(Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" }));
    expect(await health.check()).toBe(true);
    expect(health.state().state).toBe("ok");
    expect(readState(task.taskDir)).toMatchObject({ status: "terminated", exit_code: 0 });
  });
});

describe("startup sweep of credentials", () => {
  it("deletes registry-auth.json of tasks past creating and of dirs without a valid task.json", async () => {
    const running = await env.submitAndStart({ registry_username: "u", registry_password: "p" });
    // A file a start could not delete (a full disk), a dir without state, and a corrupt one.
    await writeFile(join(running.taskDir, REGISTRY_AUTH_FILE), '{"username":"u","password":"p"}');
    const orphan = join(runnersDir(), "orphan-0000abcd");
    await mkdir(join(orphan, "runner"), { recursive: true });
    await writeFile(join(orphan, REGISTRY_AUTH_FILE), '{"username":"u","password":"p"}');
    const corrupt = join(runnersDir(), "corrupt-0000abcd");
    await mkdir(corrupt, { recursive: true });
    await writeFile(join(corrupt, TASK_STATE_FILE), "{not json");
    await writeFile(join(corrupt, REGISTRY_AUTH_FILE), '{"username":"u","password":"p"}');
    // A pending task (its start cut by a restart) keeps its credentials for the pull it has not done.
    const { config } = taskConfig();
    const pendingDir = join(runnersDir(), containerNameFor(config.name, config.id));
    await mkdir(join(pendingDir, "runner"), { recursive: true });
    await writeFile(
      join(pendingDir, TASK_STATE_FILE),
      encodeTaskState({ ...newTask(config), taskDir: pendingDir }, "boot"),
    );
    await writeFile(join(pendingDir, REGISTRY_AUTH_FILE), '{"username":"u","password":"p"}');

    const next = await makeContext({ home: env.home, docker: env.docker });
    try {
      await restoreTasks(next.ctx);
      expect(existsSync(join(running.taskDir, REGISTRY_AUTH_FILE))).toBe(false);
      expect(existsSync(join(orphan, REGISTRY_AUTH_FILE))).toBe(false);
      expect(existsSync(orphan)).toBe(false);
      expect(existsSync(join(corrupt, REGISTRY_AUTH_FILE))).toBe(false);
      expect(existsSync(join(pendingDir, REGISTRY_AUTH_FILE))).toBe(true);
      expect(next.ctx.store.mustGet(config.id).status).toBe("pending");
    } finally {
      await next.dispose();
    }
  });
});
