/*
 * Submit's less common paths: a concurrent resubmit, a failure the storage probe blames on the
 * home, credentials given only in part, what it logs.
 */
import { describe, expect, it, vi } from "vitest";
import { StorageUnavailableError } from "../state/storage-health.js";
import { taskConfig } from "../testing/fixtures.js";
import type { TestEnv } from "../testing/test-context.js";
import { loggedAs, useRunnerEnv } from "../testing/runner-env.js";
import { armFailpoints } from "./failpoints.js";
import { TaskOperationError } from "./task-runner.js";

let env: TestEnv;
let lines: string[];
useRunnerEnv((current) => ({ env, lines } = current));
const logged = (msg: string): Record<string, unknown>[] => loggedAs(lines, msg);

describe("TaskRunner.submit", () => {
  it("answers a concurrent resubmit only once the first submit is durable, with the same task", async () => {
    armFailpoints("after-taskdir=1*delay(100)");
    const { config, auth } = taskConfig();
    const [first, second] = await Promise.all([
      env.runner.submit(config, auth),
      env.runner.submit(config, auth),
    ]);
    expect(second.taskDir).not.toBe("");
    expect(second).toEqual(first);
  });

  it("fails a concurrent resubmit when the first submit fails", async () => {
    armFailpoints("after-taskdir=1*delay(100),after-state:pending=1*error(boom)");
    const { config, auth } = taskConfig();
    const [first, second] = await Promise.allSettled([
      env.runner.submit(config, auth),
      env.runner.submit(config, auth),
    ]);
    for (const outcome of [first, second]) {
      expect(outcome.status).toBe("rejected");
      expect((outcome as PromiseRejectedResult).reason).toBeInstanceOf(TaskOperationError);
    }
    expect(env.ctx.store.get(config.id)).toBeUndefined();
  });

  it("logs the submitted task with its container and image", async () => {
    const task = await env.submit();
    expect(logged("task submitted")).toMatchObject([
      { taskId: task.id, containerName: task.containerName, image: "busybox:1.36" },
    ]);
  });

  it("writes credentials given with a username alone", async () => {
    armFailpoints("durable-write:registry-auth=error(boom)");
    const error = await env
      .submit({ registry_username: "me", registry_password: "" })
      .catch((e: unknown) => e);
    expect((error as Error).message).toMatch(/failpoint durable-write:registry-auth: boom$/);
  });

  it("answers 503 when the storage probe blames the home for a failure that does not say so", async () => {
    const erofs = Object.assign(new Error("read-only file system"), { code: "EROFS" });
    vi.spyOn(env.ctx.dirs, "make").mockRejectedValue(new Error("ENOENT-like surprise"));
    vi.spyOn(env.ctx.storage!, "probe").mockResolvedValue(erofs);
    const error = await env.submit({ id: "probed" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StorageUnavailableError);
    expect((error as StorageUnavailableError).cause).toBe(erofs);
    expect(env.ctx.store.get("probed")).toBeUndefined();
  });

  it("answers a plain failure when the probe finds no storage fault, or another kind of one", async () => {
    vi.spyOn(env.ctx.dirs, "make").mockRejectedValue(new Error("surprise"));
    const probe = vi.spyOn(env.ctx.storage!, "probe").mockResolvedValue(undefined);
    const clean = await env.submit({ id: "clean" }).catch((e: unknown) => e);
    expect(clean).toBeInstanceOf(TaskOperationError);
    probe.mockResolvedValue(new Error("not a storage error"));
    const other = await env.submit({ id: "other" }).catch((e: unknown) => e);
    expect(other).toBeInstanceOf(TaskOperationError);
    expect((other as Error).message).toBe("failed to create task other: surprise");
  });
});
