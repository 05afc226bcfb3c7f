/*
 * The lifecycle engine's edges: error names and messages on the wire, held (a newer release's)
 * tasks, credentials kept only as long as needed, and the resources a start that stops half-way
 * keeps or hands over. (Storage faults of its own writes: task-commits.test.ts.)
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { sshEd25519PublicKey, taskConfig } from "../testing/fixtures.js";
import { stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { recordingObserver } from "../testing/recording-observer.js";
import type { TestEnv } from "../testing/test-context.js";
import { loggedAs, useRunnerEnv } from "../testing/runner-env.js";
import { waitFor } from "../testing/wait-for.js";
import { armFailpoints } from "./failpoints.js";
import type { RunnerObserver } from "./runner-context.js";
import { TaskConflictError, TaskOperationError, TaskStateError } from "./task-runner.js";

let env: TestEnv;
let lines: string[];
useRunnerEnv((current) => ({ env, lines } = current));
const logged = (msg: string): Record<string, unknown>[] => loggedAs(lines, msg);

const heldMessage = (id: string): string =>
  `task ${id} is held by a newer taskshim (task.json version 2): this release leaves it alone`;

describe("TaskRunner errors", () => {
  it("names its errors as the API maps them", async () => {
    const { config, auth } = taskConfig();
    await env.runner.submit(config, auth);
    const conflict = await env.runner
      .submit({ ...config, image_name: "alpine:3.20" }, auth)
      .catch((e: unknown) => e);
    expect(conflict).toBeInstanceOf(TaskConflictError);
    expect(conflict).toMatchObject({
      name: "TaskConflictError",
      message: `task ${config.id} is already submitted with a different config`,
    });
    const state = await env.runner.remove(config.id).catch((e: unknown) => e);
    expect(state).toBeInstanceOf(TaskStateError);
    expect((state as Error).name).toBe("TaskStateError");
  });

  it("refuses to submit, terminate or remove a held task, changing nothing", async () => {
    const { task, container } = await env.seedTask();
    const before = readFileSync(join(task.taskDir, "task.json"), "utf8");
    env.ctx.store.modify(task.id, (d) => (d.held = { kind: "newer-format", version: 2 }));
    await expect(env.runner.submit(task.config, { username: "", password: "" })).rejects.toThrow(
      new TaskStateError(heldMessage(task.id)),
    );
    await expect(env.runner.terminate(task.id, 0, "terminated_by_user", "")).rejects.toThrow(
      new TaskStateError(heldMessage(task.id)),
    );
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    expect(container?.state).toBe("running");
    env.ctx.store.modify(task.id, (d) => {
      d.status = "terminated";
      d.terminationReason = "terminated_by_user";
    });
    await expect(env.runner.remove(task.id)).rejects.toThrow(new TaskStateError(heldMessage(task.id)));
    expect(env.docker.count("removeContainer")).toBe(0);
    expect(existsSync(task.taskDir)).toBe(true);
    expect(readFileSync(join(task.taskDir, "task.json"), "utf8")).toBe(before);
  });

  it("answers a failed container removal with a TaskOperationError and keeps the task", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    const engine = new Error("remove: engine unreachable");
    env.docker.failNext("removeContainer", engine);
    const error = await env.runner.remove(task.id).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TaskOperationError);
    expect(error).toMatchObject({
      name: "TaskOperationError",
      message: `failed to remove container task=${task.id}: remove: engine unreachable`,
      cause: engine,
    });
    expect(env.ctx.store.get(task.id)).toBeDefined();
    expect(existsSync(task.taskDir)).toBe(true);
  });

  it("answers a failed stop with a TaskOperationError carrying its cause", async () => {
    const task = await env.submitAndStart();
    const engine = new Error("stop: deadline exceeded");
    env.docker.failNext("stopContainer", engine);
    const error = await env.runner.terminate(task.id, 5, "terminated_by_user", "").catch((e: unknown) => e);
    expect(error).toMatchObject({
      name: "TaskOperationError",
      message: "failed to stop container: stop: deadline exceeded",
      cause: engine,
    });
  });

  it("removes a task, its dir and its record, and says so", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.remove(task.id);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
    expect(existsSync(task.taskDir)).toBe(false);
    expect(env.docker.find(task.containerName)).toBeUndefined();
    expect(logged("task removed")).toMatchObject([{ taskId: task.id }]);
    expect(logged("task terminated")).toMatchObject([
      { taskId: task.id, reason: "terminated_by_user", from: "running" },
    ]);
  });
});

describe("TaskRunner.start edges", () => {
  it("does nothing for a running, a terminated or an unknown task", async () => {
    const { task: running } = await env.seedTask();
    const { task: terminated } = await env.seedTask({ status: "terminated", containerState: "exited" });
    env.docker.resetCalls();
    await env.runner.start(running.id);
    await env.runner.start(terminated.id);
    await env.runner.start("no-such-task");
    expect(env.docker.calls).toEqual([]);
    expect(logged("start abandoned")).toEqual([]);
    expect(env.ctx.store.mustGet(running.id).startInFlight).toBe(false);
  });

  it("starts a task once however often it is asked to in the background", async () => {
    const { task } = await env.seedTask({ status: "pending", containerState: "none" });
    env.runner.startInBackground(task.id);
    env.runner.startInBackground(task.id);
    await env.runner.awaitStarts();
    expect(env.docker.count("pullImage")).toBe(1);
    expect(env.docker.count("createContainer")).toBe(1);
    expect(logged("task running")).toHaveLength(1);
  });

  it("marks the start in flight and writes pulling without waiting for the pull", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const task = await env.submit({ gpu: 1 });
    await waitFor(() => env.docker.count("pullImage") === 1);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "pulling", startInFlight: true });
    await waitFor(() => {
      const state = JSON.parse(readFileSync(join(task.taskDir, "task.json"), "utf8")) as { status: string };
      return state.status === "pulling";
    });
  });

  it("stops at its next step when terminated meanwhile, keeping the terminate's reason", async () => {
    armFailpoints("after-state:preparing=1*delay(150)");
    const task = await env.submit({ gpu: 1 });
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "preparing");
    await env.runner.terminate(task.id, 0, "terminated_by_user", "bye");
    await env.runner.awaitStarts();
    expect(env.docker.count("imageExists") + env.docker.count("pullImage")).toBe(0);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "bye",
      startInFlight: false,
      cleanedUp: true,
    });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(logged("start abandoned")).toMatchObject([{ taskId: task.id, why: "task terminated" }]);
  });

  it("releases GPUs it took when the task was terminated while it took them", async () => {
    armFailpoints("after-gpu-acquire=1*delay(150)");
    const task = await env.submit({ gpu: 2 });
    await waitFor(() => env.ctx.gpuLock.lockedIds().length === 2);
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.awaitStarts();
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(env.ctx.store.mustGet(task.id).gpuIds).toEqual([]);
  });

  it("does not take GPUs again for a resumed task that holds them", async () => {
    const { task } = await env.seedTask({
      status: "preparing",
      containerState: "none",
      gpus: 1,
      config: { gpu: 1 },
    });
    const held = [...task.gpuIds];
    await env.runner.start(task.id);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", gpuIds: held });
    expect(env.ctx.gpuLock.lockedIds()).toEqual(held);
  });

  it("keeps the resources of a task whose container exists when its start fails (the reconciler's)", async () => {
    env.docker.failNext("startContainer", new Error("start: port is already allocated"));
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "container_exited_with_error",
      terminationMessage: "startContainer error: start: port is already allocated",
      cleanedUp: false,
      startInFlight: false,
    });
    expect(task.containerId).toBeDefined();
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    expect(logged("task failed to start")).toMatchObject([
      { taskId: task.id, reason: "container_exited_with_error" },
    ]);
  });

  it("keeps the resources of a start cut by a shutdown (it resumes after the restart)", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const task = await env.submit({ gpu: 1 });
    await waitFor(() => env.docker.count("pullImage") === 1);
    env.shutdownController.abort(new Error("shim shutting down"));
    env.runner.cancelPulls();
    await env.runner.awaitStarts();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "pulling", cleanedUp: false });
    expect(env.ctx.gpuLock.lockedIds()).toHaveLength(1);
    expect(logged("start abandoned")).toMatchObject([
      { taskId: task.id, why: "shim shutting down during pull" },
    ]);
  });

  it("fails a start whose volumes cannot be prepared, naming the step", async () => {
    vi.spyOn(env.ctx.volumes, "prepareVolumes").mockRejectedValue(new Error("mkfs failed"));
    const task = await env.submitAndStart();
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "prepareVolumes error: mkfs failed",
    });
  });

  it("fails a start whose instance mounts cannot be prepared, naming the step", async () => {
    vi.spyOn(env.ctx.volumes, "prepareInstanceMounts").mockRejectedValue(new Error("no such dir"));
    const task = await env.submitAndStart();
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "prepareInstanceMountPoints error: no such dir",
    });
  });

  it("reports a failed start to the observer once, and a start a terminate overtook only by the terminate", async () => {
    const observer = recordingObserver();
    const { finalized } = observer;
    (env.ctx as { observer?: RunnerObserver }).observer = observer;
    env.docker.failNext("startContainer", new Error("start failed"));
    await env.submitAndStart();
    expect(finalized).toEqual(["container_exited_with_error"]);

    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const task = await env.submit();
    await waitFor(() => env.docker.count("pullImage") === 1);
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.awaitStarts();
    expect(finalized).toEqual(["container_exited_with_error", "terminated_by_user"]);
  });
});

describe("TaskRunner.release", () => {
  it("logs what it could not release, and still releases the rest", async () => {
    const task = await env.submitAndStart({
      gpu: 1,
      host_ssh_user: "ubuntu",
      host_ssh_keys: [sshEd25519PublicKey()],
    });
    vi.spyOn(env.ctx.volumes, "unmountVolumes").mockRejectedValue(new Error("umount: target is busy"));
    vi.spyOn(env.ctx.hostKeys, "reconcile").mockRejectedValue(new Error("authorized_keys: EACCES"));
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ cleanedUp: true, gpuIds: [] });
    expect(logged("task resources released with errors")).toMatchObject([
      { taskId: task.id, problems: ["umount: target is busy", "authorized_keys: EACCES"] },
    ]);
    expect(logged("task resources released")).toEqual([]);
  });

  it("logs a clean release with the GPUs it freed", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(logged("task resources released")).toMatchObject([{ taskId: task.id, gpus: task.gpuIds }]);
    expect(logged("task resources released with errors")).toEqual([]);
  });

  it("reconciles host keys only for a task that has keys and a user", async () => {
    const task = await env.submitAndStart({ host_ssh_user: "ubuntu", host_ssh_keys: [] });
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile");
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(reconcile).not.toHaveBeenCalled();
  });
});
