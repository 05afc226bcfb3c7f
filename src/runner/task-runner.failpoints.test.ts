/*
 * Every failpoint of the lifecycle fires at its documented step (docs: restart anchors): armed
 * with `error(…)`, the step it guards fails and that failure is what the task (or the request)
 * reports. The chaos tests kill the shim at these names, so a renamed or moved point would make
 * them test nothing.
 */
import { existsSync } from "node:fs";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { sshEd25519PublicKey } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { armFailpoints } from "./failpoints.js";
import { TaskOperationError } from "./task-runner.js";

let env: TestEnv;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  armFailpoints(undefined);
  await env.dispose();
});

describe("TaskRunner start failpoints", () => {
  const cases: { point: string; body?: Record<string, unknown>; reason: string; message: string }[] = [
    {
      point: "after-state:preparing",
      reason: "executor_error",
      message: "failpoint after-state:preparing: boom",
    },
    {
      point: "after-state:pulling",
      reason: "executor_error",
      message: "failpoint after-state:pulling: boom",
    },
    {
      point: "after-state:creating",
      reason: "executor_error",
      message: "failpoint after-state:creating: boom",
    },
    {
      point: "after-keys-write",
      body: { host_ssh_user: "ubuntu", host_ssh_keys: [sshEd25519PublicKey()] },
      reason: "executor_error",
      message: "failpoint after-keys-write: boom",
    },
    {
      point: "mid-pull",
      reason: "creating_container_error",
      message: "pullImage error: failed pulling busybox:1.36: failpoint mid-pull: boom",
    },
    {
      point: "after-create-before-persist",
      reason: "creating_container_error",
      message: "createContainer error: failpoint after-create-before-persist: boom",
    },
    {
      point: "after-start-before-persist",
      reason: "executor_error",
      message: "failpoint after-start-before-persist: boom",
    },
  ];
  for (const { point, body, reason, message } of cases) {
    it(`fails the start at ${point} with ${reason}`, async () => {
      armFailpoints(`${point}=1*error(boom)`);
      const task = await env.submitAndStart(body ?? {});
      expect(task).toMatchObject({
        status: "terminated",
        terminationReason: reason,
        terminationMessage: message,
      });
      expect(task.startInFlight).toBe(false);
    });
  }

  it("fires after-gpu-acquire once the GPUs are taken, before they are recorded", async () => {
    armFailpoints("after-gpu-acquire=1*error(boom)");
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "failpoint after-gpu-acquire: boom",
      gpuIds: [],
    });
  });

  it("fires after-state:running only once running is durable", async () => {
    armFailpoints("after-state:running=1*error(boom)");
    const task = await env.submitAndStart();
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "failpoint after-state:running: boom",
    });
    expect(task.containerId).toBeDefined();
  });
});

describe("TaskRunner submit failpoints", () => {
  for (const point of ["durable-write:task-dir", "after-taskdir", "after-state:pending"]) {
    it(`fails the submit at ${point} with a TaskOperationError and keeps nothing`, async () => {
      armFailpoints(`${point}=1*error(boom)`);
      const error = await env.submit({ id: "fp-task" }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(TaskOperationError);
      expect(error).toMatchObject({
        name: "TaskOperationError",
        message: `failed to create task fp-task: failpoint ${point}: boom`,
        cause: { message: `failpoint ${point}: boom` },
      });
      expect(env.ctx.store.get("fp-task")).toBeUndefined();
    });
  }

  it("fails the submit at durable-write:registry-auth only with credentials", async () => {
    armFailpoints("durable-write:registry-auth=error(boom)");
    const plain = await env.submit();
    expect(plain.status).toBe("pending");
    const error = await env
      .submit({ registry_username: "", registry_password: "secret" })
      .catch((e: unknown) => e);
    expect((error as Error).message).toMatch(
      /^failed to create task task-\d+: failpoint durable-write:registry-auth: boom$/,
    );
  });
});

describe("TaskRunner terminate, release and remove failpoints", () => {
  for (const point of [
    "after-terminate-intent",
    "after-stop-before-persist",
    "mid-release:volumes",
    "mid-release:keys",
    "mid-release:gpus",
  ]) {
    it(`fails a terminate at ${point}`, async () => {
      const task = await env.submitAndStart({
        host_ssh_user: "ubuntu",
        host_ssh_keys: [sshEd25519PublicKey()],
      });
      armFailpoints(`${point}=1*error(boom)`);
      await expect(env.runner.terminate(task.id, 0, "terminated_by_user", "")).rejects.toThrow(
        `failpoint ${point}: boom`,
      );
      // Until the stop has been seen through, the task is still running, with the intent recorded.
      const beforeStopSeen = point === "after-terminate-intent" || point === "after-stop-before-persist";
      expect(env.ctx.store.mustGet(task.id)).toMatchObject({
        status: beforeStopSeen ? "running" : "terminated",
        terminationReason: "terminated_by_user",
      });
    });
  }

  it("fails a remove at after-container-remove, with the container gone and the task kept", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    armFailpoints("after-container-remove=1*error(boom)");
    await expect(env.runner.remove(task.id)).rejects.toThrow("failpoint after-container-remove: boom");
    expect(env.docker.find(task.containerName)).toBeUndefined();
    expect(env.ctx.store.get(task.id)).toBeDefined();
    expect(existsSync(task.taskDir)).toBe(true);
  });
});
