/*
 * A start that is overtaken (its task terminated or removed underneath it) or that fails in a way
 * the disk cannot record: where it stops, what it leaves, and what it tells the operator.
 */
import { describe, expect, it, vi } from "vitest";
import type { ContainerSpec } from "../docker/docker-client.js";
import { DockerConflictError } from "../docker/docker-errors.js";
import { UserKeysReconcileError } from "../host/authorized-keys.js";
import { sshEd25519PublicKey } from "../testing/fixtures.js";
import type { TestEnv } from "../testing/test-context.js";
import { loggedAs, useRunnerEnv } from "../testing/runner-env.js";
import { waitFor } from "../testing/wait-for.js";
import { armFailpoints } from "./failpoints.js";
import type { RunnerObserver } from "./runner-context.js";

let env: TestEnv;
let lines: string[];
useRunnerEnv((current) => ({ env, lines } = current));
const logged = (msg: string): Record<string, unknown>[] => loggedAs(lines, msg);

const VOLUME = { backend: "aws", name: "data", volume_id: "vol-0abc" };

describe("TaskRunner.start overtaken", () => {
  it("stops before the image when a task without GPUs is terminated while it prepares", async () => {
    armFailpoints("after-state:preparing=1*delay(500)");
    const task = await env.submit();
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "preparing");
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.awaitStarts();
    expect(env.docker.count("imageExists") + env.docker.count("pullImage")).toBe(0);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task terminated" }]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ cleanedUp: true, startInFlight: false });
  });

  it("says the task was removed when its record went away underneath the start", async () => {
    // The record goes while the start prepares the instance mounts (its last preparing step).
    vi.spyOn(env.ctx.volumes, "prepareInstanceMounts").mockImplementation(() => {
      for (const t of env.ctx.store.list()) env.ctx.store.delete(t.id);
      return Promise.resolve();
    });
    const task = await env.submit();
    await env.runner.awaitStarts();
    expect(env.docker.calls).toEqual([]);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task removed" }]);
    expect(logged("task failed to start")).toEqual([]);
  });

  it("mounts no volume for a task terminated while it took its GPUs", async () => {
    // A second for the terminate to land between the acquire and its commit, even on a loaded
    // machine; a lost race fails the assertion below instead of waiting for a real device.
    armFailpoints("after-gpu-acquire=1*delay(1000)");
    const prepareVolumes = vi.spyOn(env.ctx.volumes, "prepareVolumes").mockResolvedValue(undefined);
    const task = await env.submit({ gpu: 1, volumes: [VOLUME] });
    await waitFor(() => env.ctx.gpuLock.lockedIds().length === 1);
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.awaitStarts();
    expect(prepareVolumes).not.toHaveBeenCalled();
    expect(env.ctx.store.mustGet(task.id).gpuIds).toEqual([]);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task terminated" }]);
  });

  it("creates no container for a task terminated just before the create, and hands its GPUs back", async () => {
    armFailpoints("after-state:creating=1*delay(500)");
    const task = await env.submit({ gpu: 1 });
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "creating");
    await env.runner.terminate(task.id, 0, "terminated_by_user", "bye");
    await env.runner.awaitStarts();
    expect(env.docker.count("createContainer")).toBe(0);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task terminated" }]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      terminationReason: "terminated_by_user",
      terminationMessage: "bye",
      cleanedUp: true,
      startInFlight: false,
      gpuIds: [],
    });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("creates no container for a task removed just before the create", async () => {
    armFailpoints("after-state:creating=1*delay(500)");
    const task = await env.submit();
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "creating");
    env.ctx.store.delete(task.id);
    await env.runner.awaitStarts();
    expect(env.docker.count("createContainer")).toBe(0);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task removed" }]);
  });

  it("names the terminate as the pull's abort reason when it landed before the pull request", async () => {
    const task = await env.submit();
    env.docker.onNext("imageExists", async () => {
      await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    });
    await env.runner.awaitStarts();
    const [failed] = logged("task failed to start");
    expect(failed).toMatchObject({ taskId: task.id, reason: "creating_container_error" });
    expect(failed?.error).toMatch(/^pullImage error: failed pulling .*busybox:1\.36: task terminated$/);
  });
});

describe("TaskRunner.start failures the disk cannot record", () => {
  it("keeps the failure in memory, releases all the same, and logs both writes that failed", async () => {
    vi.spyOn(env.ctx.volumes, "prepareVolumes").mockRejectedValue(new Error("mkfs failed"));
    const task = await env.submit();
    // Every task.json write from here on fails (not a storage error: no errno code).
    armFailpoints("durable-write:task-state=error(disk on fire)");
    await env.runner.awaitStarts();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "prepareVolumes error: mkfs failed",
      cleanedUp: true,
    });
    expect(logged("failed to record start failure")).toMatchObject([{ taskId: task.id }]);
    expect(logged("release after failed start failed")).toMatchObject([{ taskId: task.id }]);
  });

  it("logs a start that throws unexpectedly, and the task can be started again afterwards", async () => {
    const observer: RunnerObserver = {
      taskStarted: () => undefined,
      taskFinalized: () => {
        throw new Error("observer broke");
      },
      tickDone: () => undefined,
      engineSeen: () => undefined,
      pulledBytes: () => undefined,
    };
    (env.ctx as { observer?: RunnerObserver }).observer = observer;
    vi.spyOn(env.ctx.volumes, "prepareVolumes").mockRejectedValueOnce(new Error("mkfs failed"));
    const task = await env.submit();
    await env.runner.awaitStarts();
    expect(logged("start failed unexpectedly")).toMatchObject([{ taskId: task.id }]);
    // The start that threw is no longer in flight: a new one runs.
    expect(env.ctx.store.mustGet(task.id).status).toBe("preparing");
    env.runner.startInBackground(task.id);
    await env.runner.awaitStarts();
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });
});

describe("TaskRunner.start steps", () => {
  it("logs another user's host keys failure and runs the task", async () => {
    const other = new UserKeysReconcileError("bob", { cause: new Error("EACCES") });
    const failure = new AggregateError([other], "1 user failed");
    vi.spyOn(env.ctx.hostKeys, "reconcile").mockRejectedValue(failure);
    const task = await env.submitAndStart({
      host_ssh_user: "ubuntu",
      host_ssh_keys: [sshEd25519PublicKey()],
    });
    expect(task.status).toBe("running");
    expect(logged("host ssh keys of other users not reconciled")).toMatchObject([{ taskId: task.id }]);
  });

  it("fires after-volume-mount:<n> counted from 1 as each volume is mounted", async () => {
    vi.spyOn(env.ctx.volumes, "prepareVolumes").mockImplementation(async (_volumes, onMounted) => {
      await onMounted?.(0);
    });
    armFailpoints("after-volume-mount:1=error(cut)");
    const task = await env.submitAndStart({ volumes: [VOLUME] });
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "prepareVolumes error: failpoint after-volume-mount:1: cut",
    });
  });

  it("skips the pull of a pinned image the engine has, and says so at debug", async () => {
    env.docker.onNext("imageExists", () => {
      const reference = env.docker.callsOf("imageExists")[0]?.args[0] as string;
      env.docker.images.add(reference);
    });
    const task = await env.submitAndStart();
    expect(task.status).toBe("running");
    expect(env.docker.count("pullImage")).toBe(0);
    expect(logged("image present, pull skipped")).toMatchObject([{ taskId: task.id, image: "busybox:1.36" }]);
  });
});

describe("TaskRunner.start failures at debug", () => {
  const engine = new Error("engine said no");
  const failures: [string, (env: TestEnv) => void, Record<string, unknown>][] = [
    [
      "host keys",
      (e) =>
        void vi
          .spyOn(e.ctx.hostKeys, "reconcile")
          .mockRejectedValue(
            new AggregateError([new UserKeysReconcileError("ubuntu", { cause: engine })], "1 user failed"),
          ),
      { host_ssh_user: "ubuntu", host_ssh_keys: [sshEd25519PublicKey()] },
    ],
    ["volumes", (e) => void vi.spyOn(e.ctx.volumes, "prepareVolumes").mockRejectedValue(engine), {}],
    ["pull", (e) => void e.docker.failNext("pullImage", engine), {}],
    ["create", (e) => void e.docker.failNext("createContainer", engine), {}],
    ["start", (e) => void e.docker.failNext("startContainer", engine), {}],
  ];
  it.each(failures)("keeps the cause of a failed %s in the details", async (_step, fail, body) => {
    fail(env);
    const task = await env.submitAndStart(body);
    expect(task.status).toBe("terminated");
    const [details] = logged("task failed to start (details)");
    const err = details?.err as { stack?: string } | undefined;
    expect(err?.stack).toContain("caused by: ");
    expect(err?.stack).toContain("engine said no");
  });
});

describe("TaskRunner.start with a container it did not start", () => {
  it("adopts a running container found after a create answered 409, without starting it again", async () => {
    env.docker.failNext("createContainer", new DockerConflictError("create: Conflict.", 409), {
      afterEffect: true,
    });
    // The container the create made started meanwhile (a start request that landed earlier).
    env.docker.onNext("inspectContainer", () => {
      for (const c of env.docker.containers.values()) c.state = "running";
    });
    const task = await env.submitAndStart();
    expect(task.status).toBe("running");
    expect(task.containerId).toBe([...env.docker.containers.values()][0]?.id);
    expect(env.docker.count("startContainer")).toBe(0);
  });

  it("logs the running task with its container", async () => {
    const task = await env.submitAndStart();
    expect(logged("task running")).toEqual([
      expect.objectContaining({ taskId: task.id, containerId: task.containerId }),
    ]);
  });

  it("says why the container did not start when its logs cannot be read either", async () => {
    env.docker.failNext("startContainer", new Error("start: OCI runtime error"));
    env.docker.failNext("containerLogTail", new Error("logs: engine gone"));
    const task = await env.submitAndStart();
    expect(task).toMatchObject({
      terminationReason: "container_exited_with_error",
      terminationMessage: "startContainer error: start: OCI runtime error",
    });
  });

  it("gives a task without GPUs none of the gpu_devices it names", async () => {
    const task = await env.submitAndStart({
      gpu: 0,
      gpu_devices: [{ path_on_host: "/dev/kfd", path_in_container: "/dev/kfd" }],
    });
    expect(task.status).toBe("running");
    const spec = env.docker.callsOf("createContainer")[0]?.args[0] as ContainerSpec;
    expect(JSON.stringify(spec)).not.toContain("/dev/kfd");
  });
});
