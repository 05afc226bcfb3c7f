import { readFile } from "node:fs/promises";
import { getEventListeners } from "node:events";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DockerUnavailableError } from "../docker/docker-errors.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { recordingObserver } from "../testing/recording-observer.js";
import { makeContext, TEST_HOME_ID, type TestEnv } from "../testing/test-context.js";
import { waitFor } from "../testing/wait-for.js";
import { ContainerOwnership } from "./ownership.js";

let env: TestEnv;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  await env.dispose();
});

const stateFile = async (taskDir: string): Promise<Record<string, unknown>> =>
  JSON.parse(await readFile(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;

describe("Reconciler.tick (ProcessTasks cases)", () => {
  it("leaves a task with a running container running and not cleaned up", async () => {
    const { task } = await env.seedTask({ gpus: 1 });
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("running");
    expect(after.cleanedUp).toBe(false);
    expect(after.gpuIds).toEqual(task.gpuIds);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    expect(env.docker.count("inspectContainer")).toBe(0);
  });

  it("finalizes exit 0 as done_by_runner with an empty message, and cleans up", async () => {
    const { task, container } = await env.seedTask({ gpus: 1 });
    env.docker.exit(container!.id, 0);
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("done_by_runner");
    expect(after.terminationMessage).toBe("");
    expect(after.exitCode).toBe(0);
    expect(after.cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    const persisted = await stateFile(task.taskDir);
    expect(persisted).toMatchObject({
      status: "terminated",
      termination_reason: "done_by_runner",
      exit_code: 0,
    });
    expect(persisted.cleaned_up).toBe(true);
  });

  it("finalizes exit 137 as container_exited_with_error with the last log lines", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 137, { logs: ["out of memory"] });
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("container_exited_with_error");
    expect(after.terminationMessage).toContain("out of memory");
    expect(after.exitCode).toBe(137);
    expect(after.cleanedUp).toBe(true);
    expect(env.docker.callsOf("containerLogTail").map((c) => c.args)).toEqual([[container!.id, 5]]);
  });

  it("records the container's own finish time, not the time the exit was seen", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 3);
    // Seen long after it happened, as after a shim restart.
    env.docker.containers.get(container!.id)!.finishedAt = "2026-01-02T03:04:05.000Z";
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.finishedAt).toBe(Date.parse("2026-01-02T03:04:05.000Z"));
    expect((await stateFile(task.taskDir)).finished_at).toBe("2026-01-02T03:04:05.000Z");
  });

  it("keeps at most the last 5 log lines in the message", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 1, { logs: ["l1", "l2", "l3", "l4", "l5", "l6", "l7"] });
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).terminationMessage).toBe("l3\nl4\nl5\nl6\nl7");
  });

  it("finalizes a vanished container as executor_error 'container not found' with exit code null", async () => {
    const { task, container } = await env.seedTask({ gpus: 2 });
    env.docker.remove(container!.id);
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("executor_error");
    expect(after.terminationMessage).toBe("container not found");
    expect(after.exitCode).toBeNull();
    expect(after.cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    // The inspect confirmed the absence before any terminal decision.
    expect(env.docker.count("inspectContainer")).toBe(1);
    const persisted = await stateFile(task.taskDir);
    expect(persisted.exit_code).toBeNull();
  });

  it("never reads a missing list entry as an exit: inspect finds it running, the task stays running", async () => {
    const { task, container } = await env.seedTask();
    env.docker.hiddenFromList.add(container!.id);
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("running");
    expect(after.cleanedUp).toBe(false);
    expect(env.docker.callsOf("inspectContainer").map((c) => c.args[0])).toEqual([container!.id]);
  });

  it("finalizes a container left in state created as executor_error 'container was not started'", async () => {
    const { task } = await env.seedTask({ containerState: "created", gpus: 1 });
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("executor_error");
    expect(after.terminationMessage).toBe("container was not started");
    expect(after.exitCode).toBeNull();
    expect(after.cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("leaves the task running and not cleaned up when inspect fails, and retries on the next tick", async () => {
    const { task, container } = await env.seedTask({ gpus: 1 });
    env.docker.exit(container!.id, 3, { logs: ["boom"] });
    env.docker.failNext("inspectContainer", new DockerUnavailableError("inspect: deadline exceeded"));
    await env.reconciler.tick();
    let after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("running");
    expect(after.cleanedUp).toBe(false);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);

    await env.reconciler.tick();
    after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("container_exited_with_error");
    expect(after.exitCode).toBe(3);
    expect(env.docker.count("inspectContainer")).toBe(2);
  });

  it("skips a task whose start is in flight (no inspect, no stop, no change)", async () => {
    const { task: running, container: c1 } = await env.seedTask({ startInFlight: true, gpus: 1 });
    env.docker.exit(c1!.id, 0);
    const { task: terminated } = await env.seedTask({ status: "terminated", startInFlight: true, gpus: 1 });
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(running.id)).toEqual(running);
    expect(env.ctx.store.mustGet(terminated.id)).toEqual(terminated);
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.docker.count("stopContainer")).toBe(0);
    expect(env.ctx.gpuLock.lockedIds()).toHaveLength(2);
  });

  it("skips a task whose lock is held, and processes it on a later tick", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 0);
    const unlock = await env.ctx.store.lock(task.id);
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    unlock();
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).terminationReason).toBe("done_by_runner");
  });

  it("releases the GPUs of a finished task: both are acquirable afterwards", async () => {
    const { container } = await env.seedTask({ gpus: 2 });
    expect(() => env.ctx.gpuLock.acquire(1)).toThrow(/no capacity/);
    env.docker.exit(container!.id, 0);
    await env.reconciler.tick();
    expect(env.ctx.gpuLock.acquire(2)).toEqual(["/dev/dri/renderD128", "/dev/dri/renderD129"]);
  });

  it("stops (timeout 0) the running container of a terminated task, keeps its reason and cleans up", async () => {
    const { task, container } = await env.seedTask({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "stopped from the CLI",
      gpus: 1,
    });
    await env.reconciler.tick();
    expect(env.docker.callsOf("stopContainer").map((c) => c.args)).toEqual([[container!.id, 0]]);
    expect(env.docker.mustFind(container!.id).state).toBe("exited");
    const after = env.ctx.store.mustGet(task.id);
    expect(after.status).toBe("terminated");
    expect(after.terminationReason).toBe("terminated_by_user");
    expect(after.terminationMessage).toBe("stopped from the CLI");
    expect(after.cleanedUp).toBe(true);
    expect(after.exitCode).toBe(137);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("retries the stop of a terminated task's container on the next tick when it fails", async () => {
    const { task, container } = await env.seedTask({ status: "terminated", gpus: 1 });
    env.docker.failNext("stopContainer", new DockerUnavailableError("stop: deadline exceeded"));
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(false);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    await env.reconciler.tick();
    expect(env.docker.mustFind(container!.id).state).toBe("exited");
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("makes no container call for a terminated task that is already cleaned up", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", cleanedUp: true });
    const containerCalls = (): string[] =>
      env.docker.calls.map((c) => c.method).filter((method) => method !== "ping");
    await env.reconciler.tick();
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toEqual(task);
    // A terminated task already cleaned up: nothing to reconcile, so no list, inspect, stop or remove.
    expect(containerCalls()).toEqual([]);
    // The engine's idle health probe is the only Docker call, and not more than once per 5 s.
    expect(env.docker.count("ping")).toBeLessThanOrEqual(1);
    expect(env.reconciler.engineHealth().state).toBe("up");
  });

  it("changes nothing when the list fails, reports the engine down, then up after recovery", async () => {
    const { task: a, container: ca } = await env.seedTask({ gpus: 1 });
    const { task: b, container: cb } = await env.seedTask();
    env.docker.exit(ca!.id, 0);
    env.docker.remove(cb!.id);
    env.docker.failNext(
      "listTaskContainers",
      new DockerUnavailableError("list: connect ENOENT /var/run/docker.sock"),
    );
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(a.id)).toEqual(a);
    expect(env.ctx.store.mustGet(b.id)).toEqual(b);
    expect(env.docker.count("inspectContainer")).toBe(0);
    const down = env.reconciler.engineHealth();
    expect(down.state).toBe("down");
    expect(down.state === "down" ? down.error : "").toContain("ENOENT");

    await env.reconciler.tick();
    expect(env.reconciler.engineHealth().state).toBe("up");
    expect(env.ctx.store.mustGet(a.id).terminationReason).toBe("done_by_runner");
    expect(env.ctx.store.mustGet(b.id).terminationMessage).toBe("container not found");
  });

  it("makes exactly one list call per tick and inspects only containers that are not running", async () => {
    await env.seedTask();
    await env.seedTask({ containerState: "paused" });
    const { container: exitedContainer } = await env.seedTask();
    env.docker.exit(exitedContainer!.id, 0);
    await env.seedTask({ status: "terminated", containerState: "exited", cleanedUp: true });
    await env.seedTask({ status: "pulling", containerState: "none", startInFlight: true });

    await env.reconciler.tick();
    expect(env.docker.count("listTaskContainers")).toBe(1);
    expect(env.docker.callsOf("inspectContainer").map((c) => c.args[0])).toEqual([exitedContainer!.id]);

    env.docker.resetCalls();
    await env.reconciler.tick();
    expect(env.docker.count("listTaskContainers")).toBe(1);
    expect(env.docker.count("inspectContainer")).toBe(0);
  });

  it("never finalizes a task that is still being created (status creating, no container id)", async () => {
    const { task } = await env.seedTask({ status: "creating", containerState: "none" });
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toEqual(task);
  });
});

describe("Reconciler: the terminal status is durable before the release", () => {
  it.each([
    ["exit 0", 0, "done_by_runner"],
    ["exit 3", 3, "container_exited_with_error"],
    ["a vanished container", null, "executor_error"],
  ] as const)("%s: task.json says terminated when the release starts", async (_label, code, reason) => {
    const { task, container } = await env.seedTask({ gpus: 1 });
    if (code === null) env.docker.remove(container!.id);
    else env.docker.exit(container!.id, code);
    const seenAtRelease: Record<string, unknown>[] = [];
    const locksAtRelease: string[][] = [];
    const release = env.runner.release.bind(env.runner);
    vi.spyOn(env.runner, "release").mockImplementation(async (id) => {
      seenAtRelease.push(await stateFile(task.taskDir));
      locksAtRelease.push([...env.ctx.gpuLock.lockedIds()]);
      return release(id);
    });
    await env.reconciler.tick();
    expect(seenAtRelease).toHaveLength(1);
    expect(seenAtRelease[0]).toMatchObject({
      status: "terminated",
      termination_reason: reason,
      exit_code: code,
    });
    // The release had not run yet when the status was committed: GPUs still locked then.
    expect(locksAtRelease[0]).toEqual(task.gpuIds);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("a failed commit of the terminal status releases nothing (the next tick retries)", async () => {
    const { task, container } = await env.seedTask({ gpus: 1 });
    env.docker.exit(container!.id, 0);
    // Not a storage error (those finalize in memory and are written later): a failure of the
    // commit itself, which must leave the release to the next tick.
    const commit = env.runner.commit.bind(env.runner);
    const spy = vi.spyOn(env.runner, "commit").mockRejectedValueOnce(new Error("state file rejected"));
    const release = vi.spyOn(env.runner, "release");
    await env.reconciler.tick();
    expect(release).not.toHaveBeenCalled();
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    spy.mockImplementation(commit);
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "terminated", cleanedUp: true });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });
});

describe("Reconciler.run", () => {
  it("ticks at once when kicked instead of waiting for the interval, and stops on shutdown", async () => {
    const { task, container } = await env.seedTask();
    const loop = env.reconciler.run();
    // Let the first tick finish so the loop is asleep.
    await waitFor(() => env.docker.count("listTaskContainers") >= 1 && env.reconciler.stats.lastTickMs > 0);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");

    env.docker.exit(container!.id, 0);
    const kickedAt = performance.now();
    env.reconciler.kick();
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "terminated", { timeoutMs: 900 });
    expect(performance.now() - kickedAt).toBeLessThan(300);

    const stoppingAt = performance.now();
    env.shutdownController.abort();
    await loop;
    expect(performance.now() - stoppingAt).toBeLessThan(300);
  });

  it("a die event from the event stream finalizes the task by itself, without a tick", async () => {
    const { task, container } = await env.seedTask();
    // No loop: only the event can finalize the task (a wall-clock bound would fail under load).
    const events = env.reconciler.followEvents();
    await waitFor(() => env.docker.count("containerEvents") >= 1);
    env.docker.exit(container!.id, 2, { logs: ["fatal"] });
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "terminated");
    expect(env.reconciler.stats.ticks).toBe(0);
    expect(env.ctx.store.mustGet(task.id).exitCode).toBe(2);
    expect(env.ctx.store.mustGet(task.id).terminationMessage).toBe("fatal");
    env.shutdownController.abort();
    await events;
  });

  it("followEvents returns at shutdown only once the finalize an event started is done", async () => {
    const { task, container } = await env.seedTask();
    let finishCommit!: () => void;
    const held = new Promise<void>((resolve) => (finishCommit = resolve));
    const commit = env.runner.commit.bind(env.runner);
    const spy = vi.spyOn(env.runner, "commit").mockImplementation(async (id, fn) => {
      await held;
      return commit(id, fn);
    });
    let returned = false;
    const events = env.reconciler.followEvents().then(() => (returned = true));
    await waitFor(() => env.docker.count("containerEvents") >= 1);
    env.docker.exit(container!.id, 0);
    await waitFor(() => spy.mock.calls.length === 1);
    env.shutdownController.abort();
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(returned).toBe(false);
    finishCommit();
    await events;
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "terminated", cleanedUp: true });
  });

  it("takes exit code 0 from the die event of the task's container: finalized without an inspect", async () => {
    const { task, container } = await env.seedTask({ gpus: 1 });
    const inspectsBefore = env.docker.count("inspectContainer");
    env.reconciler.kick(task.id, {
      action: "die",
      containerId: container!.id,
      taskId: task.id,
      owner: TEST_HOME_ID,
      exitCode: 0,
    });
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "terminated", { timeoutMs: 900 });
    const after = env.ctx.store.mustGet(task.id);
    expect(after.terminationReason).toBe("done_by_runner");
    expect(after.terminationMessage).toBe("");
    expect(after.exitCode).toBe(0);
    expect(env.docker.count("inspectContainer")).toBe(inspectsBefore);
    await waitFor(() => env.ctx.store.mustGet(task.id).cleanedUp);
    expect((await stateFile(after.taskDir)).status).toBe("terminated");
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("does not trust a die event of another container (a stale or foreign one): inspects, still running", async () => {
    const { task } = await env.seedTask();
    env.reconciler.kick(task.id, {
      action: "die",
      containerId: "f".repeat(64),
      taskId: task.id,
      owner: TEST_HOME_ID,
      exitCode: 0,
    });
    await waitFor(() => env.docker.count("inspectContainer") >= 1);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });

  it("still inspects a non-zero exit from a die event, for the OOM flag and the last log lines", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 137, { logs: ["killed"], oomKilled: true });
    env.reconciler.kick(task.id, {
      action: "die",
      containerId: container!.id,
      taskId: task.id,
      owner: TEST_HOME_ID,
      exitCode: 137,
    });
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "terminated", { timeoutMs: 900 });
    const after = env.ctx.store.mustGet(task.id);
    expect(after.terminationReason).toBe("container_exited_with_error");
    expect(after.exitCode).toBe(137);
    expect(after.terminationMessage).toBe("container was OOM-killed\nkilled");
    expect(env.docker.count("inspectContainer")).toBeGreaterThanOrEqual(1);
    await waitFor(() => env.ctx.store.mustGet(task.id).cleanedUp);
  });
});

/** Parsed pino lines of a capturing logger whose `msg` is `msg`. */
const logged = (lines: readonly string[], msg: string): Record<string, unknown>[] =>
  lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === msg);

describe("Reconciler: what an exit's message says", () => {
  it("notes that the engine was down when the container stopped during an outage, and logs the recovery", async () => {
    const { log, lines } = capturingLogger();
    const next = await makeContext({ log });
    try {
      const { task, container } = await next.seedTask();
      await next.reconciler.tick();
      next.docker.failNext("listTaskContainers", new DockerUnavailableError("list: connect ENOENT"));
      await next.reconciler.tick();
      expect(logged(lines, "docker engine unreachable; tasks keep their status")).toHaveLength(1);
      next.docker.exit(container!.id, 3, { logs: ["last words"] });
      await next.reconciler.tick();
      expect(logged(lines, "docker engine reachable again")).toHaveLength(1);
      expect(next.ctx.store.mustGet(task.id).terminationMessage).toBe(
        "the docker engine was down or restarting when the container stopped (exit code 3)\nlast words",
      );
    } finally {
      await next.dispose();
    }
  });

  it("does not blame an outage for an exit long before it", async () => {
    const { task, container } = await env.seedTask();
    await env.reconciler.tick();
    env.docker.exit(container!.id, 4, { logs: ["old"] });
    env.docker.mustFind(container!.id).finishedAt = new Date(Date.now() - 60_000).toISOString();
    env.docker.failNext("listTaskContainers", new DockerUnavailableError("list: down"));
    await env.reconciler.tick();
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).terminationMessage).toBe("old");
  });

  it("keeps the last 4096 characters of a long message", async () => {
    const { task, container } = await env.seedTask();
    const lines = ["a", "b", "c", "d", "e"].map((c) => c.repeat(1000));
    env.docker.exit(container!.id, 1, { logs: lines });
    await env.reconciler.tick();
    const message = env.ctx.store.mustGet(task.id).terminationMessage;
    expect(message).toHaveLength(4096);
    expect(message).toBe(lines.join("\n").slice(-4096));
  });

  it("finalizes with an empty message when the log tail fails", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 2, { logs: ["unseen"] });
    env.docker.failNext("containerLogTail", new DockerUnavailableError("logs: deadline exceeded"));
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      terminationReason: "container_exited_with_error",
      terminationMessage: "",
      exitCode: 2,
    });
  });

  it("asks the log tail of an exit the list shows beside its inspect, not after it", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 137, { logs: ["killed"] });
    let tailsAskedBeforeInspect = -1;
    env.docker.onNext("inspectContainer", async () => {
      await new Promise((resolve) => setImmediate(resolve));
      tailsAskedBeforeInspect = env.docker.count("containerLogTail");
    });
    await env.reconciler.tick();
    expect(tailsAskedBeforeInspect).toBe(1);
    expect(env.docker.count("containerLogTail")).toBe(1);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      terminationReason: "container_exited_with_error",
      terminationMessage: "killed",
      exitCode: 137,
    });
  });

  it("an exit 0 the list shows is done_by_runner with no message, though its tail was asked", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 0, { logs: ["bye"] });
    env.docker.failNext("containerLogTail", new DockerUnavailableError("logs: deadline exceeded"));
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      terminationReason: "done_by_runner",
      terminationMessage: "",
      exitCode: 0,
    });
  });

  it("a suspect of an event (the list may lag) has its tail asked only once the inspect says it failed", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 2, { logs: ["boom"] });
    let tailsAskedBeforeInspect = -1;
    env.docker.onNext("inspectContainer", () => {
      tailsAskedBeforeInspect = env.docker.count("containerLogTail");
    });
    env.reconciler.kick(task.id);
    await env.reconciler.settled();
    expect(tailsAskedBeforeInspect).toBe(0);
    expect(env.docker.count("containerLogTail")).toBe(1);
  });

  it("takes the time the exit was seen when the container reports no finish time (year 1)", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 5);
    env.docker.mustFind(container!.id).finishedAt = "0001-01-01T00:00:00Z";
    const before = Date.now();
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).finishedAt).toBeGreaterThanOrEqual(before);
  });
});

describe("Reconciler: a terminated task's container", () => {
  it.each(["paused", "restarting"] as const)("stops a %s container", async (state) => {
    const { task, container } = await env.seedTask({ status: "terminated", containerState: state });
    await env.reconciler.tick();
    expect(env.docker.callsOf("stopContainer").map((c) => c.args)).toEqual([[container!.id, 0]]);
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(true);
  });

  it("does not stop an exited container, and records its exit code", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", exitCode: 5 });
    await env.reconciler.tick();
    expect(env.docker.count("stopContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ exitCode: 5, cleanedUp: true });
  });

  it("records no exit code for a container that never started", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "created" });
    await env.reconciler.tick();
    expect(env.docker.count("stopContainer")).toBe(0);
    const after = env.ctx.store.mustGet(task.id);
    expect(after.cleanedUp).toBe(true);
    expect(after.exitCode).toBeUndefined();
  });
});

describe("Reconciler: health, logs and metrics", () => {
  it("reports ticks in seconds, the engine seen, and each finalized task; logs the finish", async () => {
    const observer = recordingObserver();
    const { log, lines } = capturingLogger();
    const next = await makeContext({ observer, log });
    try {
      const { task, container } = await next.seedTask();
      next.docker.exit(container!.id, 0);
      await next.reconciler.tick();
      expect(next.reconciler.stats).toMatchObject({ ticks: 1, finalized: 1 });
      expect(next.reconciler.stats.lastTickMs).toBeGreaterThanOrEqual(0);
      expect(next.reconciler.stats.lastTickMs).toBeLessThan(5_000);
      expect(observer.ticks).toHaveLength(1);
      expect(observer.ticks[0]).toBeCloseTo(next.reconciler.stats.lastTickMs / 1000, 6);
      expect(observer.seen).toEqual([true]);
      expect(observer.finalized).toEqual(["done_by_runner"]);
      expect(logged(lines, "task finished")).toEqual([
        expect.objectContaining({ taskId: task.id, reason: "done_by_runner", exitCode: 0 }),
      ]);
      next.docker.failNext("listTaskContainers", new DockerUnavailableError("list: down"));
      const { task: other } = await next.seedTask();
      await next.reconciler.tick();
      expect(observer.seen).toEqual([true, false]);
      expect(next.ctx.store.mustGet(other.id).status).toBe("running");
    } finally {
      await next.dispose();
    }
  });

  it("keeps the time the engine went down and came up across further ticks", async () => {
    await env.seedTask();
    env.docker.down = new DockerUnavailableError("engine gone");
    await env.reconciler.tick();
    const down = env.reconciler.engineHealth();
    await new Promise((resolve) => setTimeout(resolve, 5));
    await env.reconciler.tick();
    expect(env.reconciler.engineHealth()).toEqual(down);
    env.docker.down = undefined;
    await env.reconciler.tick();
    const up = env.reconciler.engineHealth();
    expect(up.state).toBe("up");
    await new Promise((resolve) => setTimeout(resolve, 5));
    await env.reconciler.tick();
    expect(env.reconciler.engineHealth()).toEqual(up);
  });

  it("with nothing to reconcile, pings the engine at most every 5 s and reports a failed ping as down", async () => {
    // The rate limit is on the monotonic clock; `since` is the wall clock's.
    const mono = vi.spyOn(performance, "now");
    const now = vi.spyOn(Date, "now");
    try {
      mono.mockReturnValue(1_000_000);
      now.mockReturnValue(1_000_000);
      env.docker.failNext("ping", new DockerUnavailableError("ping: down"));
      await env.reconciler.tick();
      expect(env.reconciler.engineHealth().state).toBe("down");
      mono.mockReturnValue(1_004_999);
      await env.reconciler.tick();
      expect(env.docker.count("ping")).toBe(1);
      mono.mockReturnValue(1_005_000);
      now.mockReturnValue(1_005_000);
      await env.reconciler.tick();
      expect(env.docker.count("ping")).toBe(2);
      expect(env.reconciler.engineHealth()).toEqual({ state: "up", since: 1_005_000 });
    } finally {
      now.mockRestore();
      mono.mockRestore();
    }
  });

  it("logs a failed reconcile of a task with its id", async () => {
    const { log, lines } = capturingLogger();
    const next = await makeContext({ log });
    try {
      const { task, container } = await next.seedTask();
      next.docker.exit(container!.id, 3);
      next.docker.failNext("inspectContainer", new DockerUnavailableError("inspect: deadline exceeded"));
      await next.reconciler.tick();
      expect(logged(lines, "reconcile of task failed; retrying next tick")).toEqual([
        expect.objectContaining({ taskId: task.id }),
      ]);
    } finally {
      await next.dispose();
    }
  });

  it("the loop logs a failed tick, with its error, and goes on", async () => {
    const { log, lines } = capturingLogger();
    let fail = true;
    const observer = {
      ...recordingObserver(),
      tickDone: () => {
        if (fail) {
          fail = false;
          throw new Error("observer broke");
        }
      },
    };
    const next = await makeContext({ log, observer });
    try {
      const loop = next.reconciler.run();
      await waitFor(() => next.reconciler.stats.ticks >= 2);
      next.shutdownController.abort();
      await loop;
      expect(logged(lines, "reconcile tick failed")).toHaveLength(1);
      expect(logged(lines, "reconcile tick failed")[0]).toMatchObject({
        level: 50,
        err: { message: "observer broke" },
      });
    } finally {
      await next.dispose();
    }
  });
});

describe("Reconciler.followEvents", () => {
  it("kicks on die, destroy and oom of our task, not on other actions", async () => {
    const { task, container } = await env.seedTask();
    const follow = env.reconciler.followEvents();
    await waitFor(() => env.docker.count("containerEvents") >= 1);
    const event = { containerId: container!.id, taskId: task.id, owner: TEST_HOME_ID };
    env.docker.emit({ ...event, action: "start" });
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(env.docker.count("inspectContainer")).toBe(0);
    env.docker.emit({ ...event, action: "oom" });
    await waitFor(() => env.docker.count("inspectContainer") >= 1);
    env.docker.remove(container!.id);
    await waitFor(() => env.ctx.store.mustGet(task.id).status === "terminated");
    expect(env.ctx.store.mustGet(task.id).terminationMessage).toBe("container not found");
    env.shutdownController.abort();
    await follow;
  });
});

describe("Reconciler.followEvents: a dropped stream", () => {
  /** A context whose logger keeps its lines; disposed by the test. */
  async function withLog(): Promise<{ next: TestEnv; lines: string[] }> {
    const { log, lines } = capturingLogger();
    return { next: await makeContext({ log }), lines };
  }

  it("ended by the engine: kicks a full tick at once (events may be lost), reconnects after 1 s and follows again", async () => {
    const { next, lines } = await withLog();
    try {
      const { task, container } = await next.seedTask();
      const kick = vi.spyOn(next.reconciler, "kick");
      const follow = next.reconciler.followEvents();
      await waitFor(() => next.docker.openEventStreams() === 1);
      const droppedAt = performance.now();
      next.docker.dropEvents();
      await waitFor(() => kick.mock.calls.length >= 1);
      // A kick without a task id: the list catches up on every task.
      expect(kick.mock.calls).toEqual([[]]);
      expect(next.docker.count("containerEvents")).toBe(1);
      await waitFor(() => next.docker.count("containerEvents") === 2, { timeoutMs: 3_000 });
      expect(performance.now() - droppedAt).toBeGreaterThanOrEqual(950);
      await waitFor(() => next.docker.openEventStreams() === 1);
      // A quiet end is no error: nothing logged about a drop.
      expect(logged(lines, "docker event stream dropped; reconnecting")).toEqual([]);
      // The new stream is followed: a die event of our task finalizes it.
      next.docker.exit(container!.id, 0);
      await waitFor(() => next.ctx.store.mustGet(task.id).status === "terminated");
      expect(kick).toHaveBeenLastCalledWith(task.id, expect.objectContaining({ action: "die", exitCode: 0 }));
      next.shutdownController.abort();
      await follow;
    } finally {
      await next.dispose();
    }
  });

  it("broken: logs the error at debug, kicks, and reconnects", async () => {
    const { next, lines } = await withLog();
    try {
      await next.seedTask();
      const kick = vi.spyOn(next.reconciler, "kick");
      const follow = next.reconciler.followEvents();
      await waitFor(() => next.docker.openEventStreams() === 1);
      next.docker.dropEvents(new DockerUnavailableError("events: socket hang up"));
      await waitFor(() => kick.mock.calls.length >= 1);
      const dropped = logged(lines, "docker event stream dropped; reconnecting");
      expect(dropped).toHaveLength(1);
      expect(dropped[0]).toMatchObject({ level: 20, err: { message: "events: socket hang up" } });
      await waitFor(() => next.docker.count("containerEvents") === 2, { timeoutMs: 3_000 });
      next.shutdownController.abort();
      await follow;
      // Shutdown ends the stream without a "dropped" line.
      expect(logged(lines, "docker event stream dropped; reconnecting")).toHaveLength(1);
    } finally {
      await next.dispose();
    }
  });

  it("refused at connect: waits 1 s before each new attempt, not a busy loop", async () => {
    env.docker.failNext("containerEvents", new DockerUnavailableError("events: connect ECONNREFUSED"));
    env.docker.failNext("containerEvents", new DockerUnavailableError("events: connect ECONNREFUSED"));
    const follow = env.reconciler.followEvents();
    await waitFor(() => env.docker.count("containerEvents") >= 1);
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(env.docker.count("containerEvents")).toBe(1);
    await waitFor(() => env.docker.count("containerEvents") === 3, { timeoutMs: 4_000 });
    await waitFor(() => env.docker.openEventStreams() === 1);
    env.shutdownController.abort();
    await follow;
  });

  it("shutdown during the back-off ends at once, without another connection", async () => {
    const follow = env.reconciler.followEvents();
    await waitFor(() => env.docker.openEventStreams() === 1);
    env.docker.dropEvents(new Error("events: reset"));
    await new Promise((resolve) => setTimeout(resolve, 50));
    const stoppingAt = performance.now();
    env.shutdownController.abort();
    await follow;
    expect(performance.now() - stoppingAt).toBeLessThan(500);
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    expect(env.docker.count("containerEvents")).toBe(1);
  });

  it("shutdown while following returns without a kick or a reconnect", async () => {
    const kick = vi.spyOn(env.reconciler, "kick");
    const follow = env.reconciler.followEvents();
    await waitFor(() => env.docker.openEventStreams() === 1);
    env.shutdownController.abort();
    await follow;
    expect(kick).not.toHaveBeenCalled();
    expect(env.docker.count("containerEvents")).toBe(1);
  });

  it("does not follow at all once shut down", async () => {
    env.shutdownController.abort();
    await env.reconciler.followEvents();
    expect(env.docker.count("containerEvents")).toBe(0);
  });
});

describe("Reconciler.kick", () => {
  it("takes no fast path for a task that is not running, nor after shutdown", async () => {
    const { task } = await env.seedTask({ status: "terminated", cleanedUp: true, containerState: "exited" });
    const { task: running, container } = await env.seedTask();
    env.reconciler.kick(task.id);
    env.shutdownController.abort();
    env.docker.exit(container!.id, 1);
    env.reconciler.kick(running.id);
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(env.docker.count("inspectContainer")).toBe(0);
  });
});

describe("Reconciler: which container stands for a task", () => {
  it("counts an unlabelled container of a task id this home does not hold as foreign", async () => {
    const counts: number[] = [];
    const next = await makeContext({
      ownership: new ContainerOwnership(TEST_HOME_ID, false, undefined, (n) => counts.push(n)),
    });
    try {
      await next.seedTask();
      next.docker.addContainer({ taskId: "not-a-task-of-this-home" });
      await next.reconciler.tick();
      expect(counts).toEqual([1]);
    } finally {
      await next.dispose();
    }
  });

  it("another container with the task's id (not the task's own) does not stand in for it", async () => {
    const { task, container } = await env.seedTask();
    // Listed after the task's own container: it would win a plain "last one" rule.
    const stray = env.docker.addContainer({ taskId: task.id, state: "exited", exitCode: 9 });
    await env.reconciler.tick();
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    expect(stray.id).not.toBe(container!.id);
  });

  it("a task without a container id takes the listed container of its task id", async () => {
    const { task } = await env.seedTask({ withContainerId: false });
    await env.reconciler.tick();
    // Listed as running: no inspect needed.
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });

  it("does not inspect a task whose container is listed as restarting", async () => {
    const { task } = await env.seedTask({ containerState: "restarting" });
    await env.reconciler.tick();
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });

  it("a tick that finds the shim shutting down reconciles nothing", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 0);
    const listed = await env.docker.listTaskContainers();
    env.shutdownController.abort();
    env.docker.resetCalls();
    await env.reconciler.tick(listed);
    expect(env.docker.calls).toEqual([]);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
  });
});

describe("Reconciler.kick: a suspect task", () => {
  it("is inspected on the next tick even though the list still says running, then no longer", async () => {
    const { task, container } = await env.seedTask();
    // A tick holds the task: the fast path cannot take it, the suspect waits for the next tick.
    const unlock = await env.ctx.store.lock(task.id);
    env.reconciler.kick(task.id);
    unlock();
    await env.reconciler.tick();
    expect(env.docker.callsOf("inspectContainer").map((c) => c.args[0])).toEqual([container!.id]);
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    await env.reconciler.tick();
    expect(env.docker.count("inspectContainer")).toBe(1);
  });

  it("the exit an inspect of a suspect finds is final, though the list said running", async () => {
    const { task, container } = await env.seedTask();
    const unlock = await env.ctx.store.lock(task.id);
    env.reconciler.kick(task.id);
    unlock();
    // The engine's list lags behind its die event: it still lists the container as running.
    env.docker.onNext("inspectContainer", () => {
      const c = env.docker.mustFind(container!.id);
      c.state = "exited";
      c.exitCode = 0;
    });
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "done_by_runner",
    });
  });

  it("the fast path forgets its work once settled", async () => {
    const { task, container } = await env.seedTask();
    env.docker.exit(container!.id, 0);
    env.reconciler.kick(task.id);
    await waitFor(() => env.ctx.store.mustGet(task.id).cleanedUp);
    const inFlight = (env.reconciler as unknown as { fastPath: Set<Promise<void>> }).fastPath;
    await waitFor(() => inFlight.size === 0);
    expect(inFlight.size).toBe(0);
  });
});

describe("Reconciler: when a stop lands during an outage", () => {
  it("blames the engine for exits from 1 s before the last good answer up to the recovery, not after", async () => {
    const now = vi.spyOn(Date, "now");
    try {
      now.mockReturnValue(1_000_000);
      const seeded = await Promise.all([0, 1, 2, 3, 4].map(() => env.seedTask()));
      await env.reconciler.tick(); // up at 1_000_000
      now.mockReturnValue(1_001_000);
      env.docker.failNext("listTaskContainers", new DockerUnavailableError("list: down"));
      await env.reconciler.tick(); // down
      const finished = [998_999, 999_000, 1_002_000, 1_002_001, 1_001_500];
      seeded.forEach(({ container }, i) => {
        env.docker.exit(container!.id, 7, { logs: ["bye"] });
        env.docker.mustFind(container!.id).finishedAt = new Date(finished[i]!).toISOString();
      });
      now.mockReturnValue(1_002_000);
      await env.reconciler.tick(); // up again: the outage was 1_000_000..1_002_000
      const blamed = seeded.map(({ task }) =>
        env.ctx.store.mustGet(task.id).terminationMessage.startsWith("the docker engine was down"),
      );
      expect(blamed).toEqual([false, true, true, false, true]);
    } finally {
      now.mockRestore();
    }
  });
});

describe("Reconciler: a terminated task's exit code", () => {
  it("keeps an exit code already recorded (no inspect)", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", exitCode: 137 });
    await env.ctx.store.lock(task.id).then((unlock) => {
      env.ctx.store.modify(task.id, (d) => (d.exitCode = 3));
      unlock();
    });
    await env.reconciler.tick();
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ exitCode: 3, cleanedUp: true });
  });

  it("leaves alone a terminated task cleaned up by someone else while the tick listed", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", exitCode: 6 });
    env.docker.onNext("listTaskContainers", () => env.runner.release(task.id));
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(true);
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id).exitCode).toBeUndefined();
  });

  it("cleans up a terminated task whose container is gone, without an exit code", async () => {
    const { task, container } = await env.seedTask({ status: "terminated", containerState: "exited" });
    env.docker.remove(container!.id);
    await env.reconciler.tick();
    expect(env.docker.count("inspectContainer")).toBe(0);
    const after = env.ctx.store.mustGet(task.id);
    expect(after.cleanedUp).toBe(true);
    expect(after.exitCode).toBeUndefined();
  });

  it("records no exit code when the container vanishes between the list and the inspect", async () => {
    const { task, container } = await env.seedTask({
      status: "terminated",
      containerState: "exited",
      exitCode: 4,
    });
    env.docker.onNext("inspectContainer", () => env.docker.remove(container!.id));
    await env.reconciler.tick();
    const after = env.ctx.store.mustGet(task.id);
    expect(after.cleanedUp).toBe(true);
    expect(after.exitCode).toBeUndefined();
  });
});

describe("Reconciler.run: its pace", () => {
  it("starts ticks 850 ms apart (fixed rate: a slow tick does not push the next one back)", async () => {
    await env.seedTask();
    const starts: number[] = [];
    const slowList = async (): Promise<void> => {
      starts.push(performance.now());
      await new Promise((resolve) => setTimeout(resolve, 400));
    };
    env.docker.onNext("listTaskContainers", slowList);
    env.docker.onNext("listTaskContainers", () => void starts.push(performance.now()));
    const loop = env.reconciler.run();
    await waitFor(() => starts.length >= 2, { timeoutMs: 3_000 });
    env.shutdownController.abort();
    await loop;
    const gap = starts[1]! - starts[0]!;
    expect(gap).toBeGreaterThanOrEqual(800);
    expect(gap).toBeLessThan(1_200);
  });

  it("a kick during a tick makes the next tick start at once", async () => {
    await env.seedTask();
    const starts: number[] = [];
    env.docker.onNext("listTaskContainers", () => {
      starts.push(performance.now());
      env.reconciler.kick();
    });
    env.docker.onNext("listTaskContainers", () => void starts.push(performance.now()));
    const loop = env.reconciler.run();
    await waitFor(() => starts.length >= 2, { timeoutMs: 3_000 });
    env.shutdownController.abort();
    await loop;
    expect(starts[1]! - starts[0]!).toBeLessThan(500);
  });

  it("does not pile up abort listeners on the shutdown signal while it waits", async () => {
    await env.seedTask();
    const loop = env.reconciler.run();
    for (let i = 1; i <= 4; i++) {
      await waitFor(() => env.reconciler.stats.ticks >= i, { timeoutMs: 3_000 });
      env.reconciler.kick();
    }
    const listeners = getEventListeners(env.ctx.shutdown, "abort").length;
    env.shutdownController.abort();
    await loop;
    expect(listeners).toBeLessThanOrEqual(2);
  });

  it("waits for fast-path work in flight before it returns", async () => {
    const { task, container } = await env.seedTask();
    const loop = env.reconciler.run();
    await waitFor(() => env.reconciler.stats.ticks >= 1);
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    env.docker.onNext("inspectContainer", () => gate);
    env.docker.exit(container!.id, 5);
    env.reconciler.kick(task.id);
    await waitFor(() => env.docker.count("inspectContainer") >= 1);
    env.shutdownController.abort();
    let returned = false;
    void loop.then(() => (returned = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(returned).toBe(false);
    open();
    await loop;
  });
});

describe("Reconciler.followEvents: which events count", () => {
  it("logs each event at debug, and ignores an unlabelled container's event for a task id it does not hold", async () => {
    const { log, lines } = capturingLogger();
    const next = await makeContext({ log });
    try {
      const { task, container } = await next.seedTask();
      const kick = vi.spyOn(next.reconciler, "kick");
      const follow = next.reconciler.followEvents();
      await waitFor(() => next.docker.openEventStreams() === 1);
      next.docker.emit({
        action: "die",
        containerId: "e".repeat(64),
        taskId: "unknown-task",
        owner: "",
        exitCode: 1,
      });
      next.docker.emit({
        action: "die",
        containerId: container!.id,
        taskId: task.id,
        owner: "",
        exitCode: 1,
      });
      await waitFor(() => logged(lines, "container event").length === 2);
      await waitFor(() => kick.mock.calls.length >= 1);
      expect(kick.mock.calls.map((c) => c[0])).toEqual([task.id]);
      expect(logged(lines, "container event")).toEqual([
        expect.objectContaining({ level: 20, taskId: "unknown-task", action: "die" }),
        expect.objectContaining({ level: 20, taskId: task.id, action: "die" }),
      ]);
      next.shutdownController.abort();
      await follow;
    } finally {
      await next.dispose();
    }
  });
});
