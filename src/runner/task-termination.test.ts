/*
 * Terminate, release and remove: who releases a task's resources and when (never under a start
 * that is still mounting), what a repeated terminate says, and what a remove leaves behind.
 */
import { describe, expect, it, vi } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID } from "../docker/docker-client.js";
import { sshEd25519PublicKey } from "../testing/fixtures.js";
import { stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { recordingObserver } from "../testing/recording-observer.js";
import { TEST_HOME_ID, type TestEnv } from "../testing/test-context.js";
import { loggedAs, useRunnerEnv } from "../testing/runner-env.js";
import { waitFor } from "../testing/wait-for.js";
import { armFailpoints } from "./failpoints.js";
import type { RunnerObserver } from "./runner-context.js";

let env: TestEnv;
let lines: string[];
useRunnerEnv((current) => ({ env, lines } = current));
const logged = (msg: string): Record<string, unknown>[] => loggedAs(lines, msg);

const VOLUME = { backend: "aws", name: "data", volume_id: "vol-0abc" };

/** Holds prepareVolumes until `finish` is called, and journals it and unmountVolumes in order. */
function holdVolumePreparation(): { events: string[]; finish: () => void } {
  const events: string[] = [];
  let finish = (): void => undefined;
  const held = new Promise<void>((resolve) => (finish = resolve));
  vi.spyOn(env.ctx.volumes, "prepareVolumes").mockImplementation(async () => {
    events.push("prepare started");
    await held;
    events.push("prepare done");
  });
  vi.spyOn(env.ctx.volumes, "unmountVolumes").mockImplementation(() => {
    events.push("unmount");
    return Promise.resolve();
  });
  return { events, finish: () => finish() };
}

describe("TaskRunner.terminate of a start in flight", () => {
  it("leaves the release to the start, which unmounts only once its mount is done", async () => {
    const { events, finish } = holdVolumePreparation();
    const task = await env.submit({ gpu: 1, volumes: [VOLUME] });
    await waitFor(() => events.includes("prepare started"));
    const after = await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(after).toMatchObject({ status: "terminated", cleanedUp: false });
    expect(events).toEqual(["prepare started"]);
    finish();
    await env.runner.awaitStarts();
    expect(events).toEqual(["prepare started", "prepare done", "unmount"]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ cleanedUp: true, gpuIds: [] });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("lets a remove wait for the start to hand its resources over", async () => {
    const { events, finish } = holdVolumePreparation();
    const task = await env.submit({ volumes: [VOLUME] });
    await waitFor(() => events.includes("prepare started"));
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    const removed = env.runner.remove(task.id).then(() => events.push("removed"));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(events).toEqual(["prepare started"]);
    finish();
    await removed;
    expect(events).toEqual(["prepare started", "prepare done", "unmount", "removed"]);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
  });

  it("names the terminate's reason as the abort reason of a pull in flight", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const task = await env.submit();
    await waitFor(() => env.docker.count("pullImage") === 1);
    await env.runner.terminate(task.id, 0, "terminated_by_server", "");
    await env.runner.awaitStarts();
    expect(env.docker.callsOf("pullImage")[0]?.signal?.reason).toEqual(
      new Error("terminated: terminated_by_server"),
    );
  });
});

describe("TaskRunner.terminate repeated", () => {
  it("logs and reports the terminate once, however often it is repeated", async () => {
    const observer = recordingObserver();
    const { finalized } = observer;
    (env.ctx as { observer?: RunnerObserver }).observer = observer;
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    await env.runner.terminate(task.id, 0, "terminated_by_server", "");
    expect(logged("task terminated")).toMatchObject([
      { taskId: task.id, reason: "terminated_by_user", from: "running" },
    ]);
    expect(finalized).toEqual(["terminated_by_user"]);
  });

  it("stops a live task's container even when its record already carries an exit code", async () => {
    const { task, container } = await env.seedTask();
    env.ctx.store.modify(task.id, (d) => (d.exitCode = 0));
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(env.docker.count("stopContainer")).toBe(1);
    expect(container?.state).not.toBe("running");
  });
});

describe("TaskRunner.release edges", () => {
  it("reconciles no host keys for keys without a user", async () => {
    const { task } = await env.seedTask({
      status: "terminated",
      containerState: "exited",
      config: { host_ssh_user: "", host_ssh_keys: [sshEd25519PublicKey()] },
    });
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile");
    await env.runner.release(task.id);
    expect(reconcile).not.toHaveBeenCalled();
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(true);
  });

  it("frees the GPUs of a task whose record went away during the release, without failing", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", gpus: 1 });
    vi.spyOn(env.ctx.volumes, "unmountVolumes").mockImplementation(() => {
      env.ctx.store.delete(task.id);
      return Promise.resolve();
    });
    await env.runner.release(task.id);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(logged("task resources released")).toMatchObject([{ taskId: task.id, gpus: task.gpuIds }]);
  });
});

describe("TaskRunner.remove edges", () => {
  it("leaves a same-named container of another task or another home alone", async () => {
    for (const labels of [
      (id: string) => ({
        [LABEL_IS_TASK]: "true",
        [LABEL_TASK_ID]: `${id}-other`,
        [LABEL_OWNER]: TEST_HOME_ID,
      }),
      (id: string) => ({ [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: id, [LABEL_OWNER]: "another-home" }),
    ]) {
      const { task, container } = await env.seedTask({
        status: "terminated",
        containerState: "exited",
        withContainerId: false,
        cleanedUp: true,
      });
      container!.labels = labels(task.id);
      await env.runner.remove(task.id);
      expect(env.docker.find(container!.id)).toBeDefined();
      expect(env.ctx.store.get(task.id)).toBeUndefined();
    }
    expect(env.docker.count("removeContainer")).toBe(0);
  });

  it("deletes no dir for a task that has none", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "none", cleanedUp: true });
    env.ctx.store.modify(task.id, (d) => (d.taskDir = ""));
    const removeDir = vi.spyOn(env.ctx.dirs, "remove");
    await env.runner.remove(task.id);
    expect(removeDir).not.toHaveBeenCalled();
    expect(env.ctx.store.get(task.id)).toBeUndefined();
  });

  it("leaves nothing to write for a removed task whose release could not be written", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", gpus: 1 });
    // The remove's own write passes; the release's write then meets a full disk.
    vi.spyOn(env.ctx.volumes, "unmountVolumes").mockImplementation(() => {
      armFailpoints("durable-write:task-state=1*error(ENOSPC)");
      return Promise.resolve();
    });
    await env.runner.remove(task.id);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
    expect(env.runner.persister.unsyncedIds()).toEqual([]);
    expect(await env.runner.catchUpStorage()).toBe(true);
  });
});

describe("TaskRunner.reconcileHostKeys", () => {
  it("revokes freely while every live task's keys are known", async () => {
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile").mockResolvedValue(undefined);
    await env.seedTask();
    await env.runner.reconcileHostKeys();
    expect(reconcile.mock.calls[0]?.[1]).toEqual({ keepExisting: false });
  });
});
