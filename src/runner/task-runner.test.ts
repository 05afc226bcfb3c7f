import { existsSync, readFileSync } from "node:fs";
import { readFile, rm, symlink } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID, type ContainerSpec } from "../docker/docker-client.js";
import { DockerConflictError } from "../docker/docker-errors.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { containerNameFor } from "../tasks/container-name.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { exited } from "../testing/fake-command-runner.js";
import { sshEd25519PublicKey, taskConfig } from "../testing/fixtures.js";
import { pullStream, stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { waitFor } from "../testing/wait-for.js";
import { TaskConflictError, TaskStateError } from "./task-runner.js";

const BOTH_GPUS = ["/dev/dri/renderD128", "/dev/dri/renderD129"];

let env: TestEnv;
const extraEnvs: TestEnv[] = [];

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  for (const extra of extraEnvs.splice(0)) await extra.dispose();
  await env.dispose();
});

const readState = (taskDir: string): Record<string, unknown> =>
  JSON.parse(readFileSync(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;

/** Whether `promise` settles within `ms` (a hang fails the test instead of timing it out). */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  const settled = promise.then(
    () => true as const,
    () => true as const,
  );
  try {
    return await Promise.race([settled, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Every GPU id a spied `GpuLock.release` actually freed, over all its calls. */
function releasedIds(spy: { mock: { results: { type: string; value: unknown }[] } }): string[] {
  return spy.mock.results.flatMap((r) => (r.type === "return" ? (r.value as string[]) : [])).sort();
}

describe("TaskRunner.submit", () => {
  it("persists task.json before it resolves", async () => {
    const { config, auth } = taskConfig();
    const task = await env.runner.submit(config, auth);
    // Read synchronously, before anything else can run.
    expect(task.taskDir).not.toBe("");
    const state = readState(task.taskDir);
    expect(state).toMatchObject({ version: 1, id: config.id, config: { id: config.id, name: config.name } });
    expect(task.taskDir).toBe(join(env.home, "runners", containerNameFor(config.name, config.id)));
  });

  it("is idempotent for the same config: the same task, started once", async () => {
    const { config, auth } = taskConfig();
    const [first, second] = await Promise.all([
      env.runner.submit(config, auth),
      env.runner.submit(config, auth),
    ]);
    expect(second.id).toBe(first.id);
    await env.runner.awaitStarts();
    // A retried submit after the task runs: a fresh parse, keys in another order.
    const retry = parseTaskConfig({ image_name: config.image_name, name: config.name, id: config.id }).config;
    const third = await env.runner.submit(retry, auth);
    await env.runner.awaitStarts();
    expect(third.id).toBe(first.id);
    expect(third.status).toBe("running");
    expect(env.ctx.store.size).toBe(1);
    expect(env.docker.count("createContainer")).toBe(1);
    expect(env.docker.count("startContainer")).toBe(1);
  });

  it("rejects the same id with a different config as a TaskConflictError", async () => {
    const { config, auth } = taskConfig();
    await env.runner.submit(config, auth);
    const other = parseTaskConfig({ id: config.id, name: config.name, image_name: "busybox:1.37" }).config;
    await expect(env.runner.submit(other, auth)).rejects.toBeInstanceOf(TaskConflictError);
    await env.runner.awaitStarts();
    expect(env.ctx.store.mustGet(config.id).config.image_name).toBe("busybox:1.36");
    expect(env.docker.count("createContainer")).toBe(1);
  });
});

describe("TaskRunner.start", () => {
  it("asks the engine once for an image that concurrent starts share, and again for a later start", async () => {
    // A check that lasts until all three starts wait on it, as the engine's may under a burst of
    // submits. A start asks right after it shows `pulling` (in the same run of microtasks), so
    // once a poll sees all three `pulling`, all three have asked.
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const imageExists = vi.spyOn(env.docker, "imageExists").mockImplementation(async () => {
      await answered;
      return true;
    });
    const submitAll = (ids: string[]) =>
      Promise.all(
        ids.map((id) => {
          const { config, auth } = taskConfig({ id, name: id, image_name: "busybox:1.36" });
          return env.runner.submit(config, auth);
        }),
      );
    await submitAll(["a", "b", "c"]);
    await waitFor(() => ["a", "b", "c"].every((id) => env.ctx.store.get(id)?.status === "pulling"));
    answer();
    await env.runner.awaitStarts();
    expect(imageExists).toHaveBeenCalledTimes(1);
    await submitAll(["d"]);
    await env.runner.awaitStarts();
    expect(imageExists).toHaveBeenCalledTimes(2);
    expect(env.docker.count("pullImage")).toBe(0);
    expect(["a", "b", "c", "d"].map((id) => env.ctx.store.mustGet(id).status)).toEqual([
      "running",
      "running",
      "running",
      "running",
    ]);
  });

  // `running` is shown only once durable: a kill in between must never un-say it. An exit is shown
  // at once: the container keeps it on record, so a restart re-derives the same answer, and it is
  // durable before the release (reconciler.test.ts).
  it("shows running only once task.json says so, and an exit before its write", async () => {
    // What a read could see, and what task.json held at that moment.
    const seen: [TaskStatus, string | undefined][] = [];
    const modify = env.ctx.store.modify.bind(env.ctx.store);
    vi.spyOn(env.ctx.store, "modify").mockImplementation((id, fn) => {
      const task = modify(id, fn);
      if (task.status === "running" || task.status === "terminated") {
        const file = join(task.taskDir, TASK_STATE_FILE);
        const onDisk = existsSync(file)
          ? (JSON.parse(readFileSync(file, "utf8")) as { status?: string }).status
          : undefined;
        if (seen.at(-1)?.[0] !== task.status) seen.push([task.status, onDisk]);
      }
      return task;
    });
    const task = await env.submitAndStart({ command: ["true"] });
    env.docker.exit(task.containerId!, 0);
    await env.reconciler.tick();
    expect(seen).toEqual([
      ["running", "running"],
      ["terminated", "running"],
    ]);
    expect(JSON.parse(readFileSync(join(task.taskDir, TASK_STATE_FILE), "utf8"))).toMatchObject({
      status: "terminated",
      exit_code: 0,
    });
  });

  it("runs pending → preparing → pulling → creating → running and creates exactly one labelled container", async () => {
    const statuses: TaskStatus[] = [];
    const modify = env.ctx.store.modify.bind(env.ctx.store);
    vi.spyOn(env.ctx.store, "modify").mockImplementation((id, fn) => {
      const task = modify(id, fn);
      if (statuses.at(-1) !== task.status) statuses.push(task.status);
      return task;
    });
    const task = await env.submitAndStart({ gpu: 1 });
    expect(statuses).toEqual(["pending", "preparing", "pulling", "creating", "running"]);

    const creates = env.docker.callsOf("createContainer");
    expect(creates).toHaveLength(1);
    const spec = creates[0]?.args[0] as ContainerSpec;
    expect(spec.name).toBe(containerNameFor(task.config.name, task.id));
    expect(spec.name).toMatch(new RegExp(`^${task.config.name}-[0-9a-f]{8}$`));
    expect(spec.labels).toEqual({
      [LABEL_IS_TASK]: "true",
      [LABEL_TASK_ID]: task.id,
      [LABEL_OWNER]: env.ctx.ownership.homeId,
    });

    const container = env.docker.mustFind(spec.name);
    expect(container.state).toBe("running");
    expect(task.containerId).toBe(container.id);
    expect(task.containerName).toBe(spec.name);
    expect(env.docker.callsOf("startContainer").map((c) => c.args)).toEqual([[container.id]]);
    expect(task.status).toBe("running");
    expect(task.startInFlight).toBe(false);
    expect(task.ports).toEqual([]);
    expect(task.gpuIds).toEqual(["/dev/dri/renderD128"]);
    expect(task.pullProgress).toMatchObject({ total_bytes: 1024, extracted_bytes: 1024 });
    expect(readState(task.taskDir)).toMatchObject({
      status: "running",
      termination_reason: "",
      cleaned_up: false,
    });
  });

  it("fails a pull whose stream reports an error mid-stream with creating_container_error", async () => {
    const registryError = "received unexpected HTTP status: 502 Bad Gateway";
    env.docker.pullScript = () =>
      pullStream([
        ...SUCCESSFUL_PULL_LINES.slice(0, 3),
        JSON.stringify({ errorDetail: { message: registryError }, error: registryError }),
        // A stream that still ends "successfully" must not turn the failure into a success.
        '{"status":"Status: Downloaded newer image for busybox:1.36"}',
      ]);
    const task = await env.submitAndStart({ gpu: 2 });
    expect(task.status).toBe("terminated");
    expect(task.terminationReason).toBe("creating_container_error");
    expect(task.terminationMessage).toContain(registryError);
    expect(task.cleanedUp).toBe(true);
    expect(task.startInFlight).toBe(false);
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(readState(task.taskDir)).toMatchObject({
      termination_reason: "creating_container_error",
      cleaned_up: true,
    });
  });

  it("never writes registry credentials to task.json, pull.log or the log", async () => {
    const password = "pa55-s3cr3t-w0rd";
    const captured = capturingLogger();
    const own = await makeContext({ log: captured.log });
    extraEnvs.push(own);
    const task = await own.submitAndStart({
      image_name: "registry.example.com:5000/team/app:1.0",
      registry_username: "alice-registry-user",
      registry_password: password,
    });
    expect(task.status).toBe("running");
    // The credentials did reach the engine…
    const pull = own.docker.callsOf("pullImage")[0];
    expect(pull?.args[1]).toMatchObject({ username: "alice-registry-user", password });
    // …and nothing else.
    const stateText = await readFile(join(task.taskDir, TASK_STATE_FILE), "utf8");
    const pullLog = await readFile(join(task.taskDir, "pull.log"), "utf8");
    expect(pullLog).toContain("Status: Downloaded newer image");
    for (const text of [stateText, pullLog]) {
      expect(text).not.toContain(password);
      expect(text).not.toContain("alice-registry-user");
    }
    expect(captured.lines.length).toBeGreaterThan(0);
    expect(captured.lines.join("")).not.toContain(password);
  });

  it("fails with executor_error 'no capacity: …' when GPUs run out, and locks nothing", async () => {
    const holder = await env.submitAndStart({ gpu: 1 });
    const task = await env.submitAndStart({ gpu: 2 });
    expect(task.status).toBe("terminated");
    expect(task.terminationReason).toBe("executor_error");
    expect(task.terminationMessage).toMatch(/^no capacity: /);
    expect(task.gpuIds).toEqual([]);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(holder.gpuIds);
    expect(env.docker.count("createContainer")).toBe(1);
    expect(env.docker.count("pullImage")).toBe(1);
  });

  it("adopts its own container when a create answers 409 after creating it, never duplicating it", async () => {
    env.docker.failNext(
      "createContainer",
      new DockerConflictError('create: Conflict. The container name "/x" is already in use', 409),
      { afterEffect: true },
    );
    const task = await env.submitAndStart();
    expect(task.status).toBe("running");
    const ours = [...env.docker.containers.values()].filter((c) => c.labels[LABEL_TASK_ID] === task.id);
    expect(ours).toHaveLength(1);
    expect(task.containerId).toBe(ours[0]?.id);
    expect(env.docker.count("createContainer")).toBe(1);
    expect(env.docker.callsOf("startContainer").map((c) => c.args[0])).toEqual([ours[0]?.id]);
  });

  it("refuses to adopt a container of the same name that belongs to another task", async () => {
    const { config, auth } = taskConfig();
    const foreign = env.docker.addContainer({
      taskId: "someone-else",
      name: containerNameFor(config.name, config.id),
      state: "running",
    });
    await env.runner.submit(config, auth);
    await env.runner.awaitStarts();
    const task = env.ctx.store.mustGet(config.id);
    expect(task.status).toBe("terminated");
    expect(task.terminationReason).toBe("creating_container_error");
    expect(task.containerId).toBeUndefined();
    expect(env.docker.count("startContainer")).toBe(0);
    expect(env.docker.count("stopContainer")).toBe(0);
    expect(env.docker.mustFind(foreign.id).state).toBe("running");
  });

  it("reports a container that fails to start with its last log lines", async () => {
    env.docker.failNext("startContainer", new Error("OCI runtime create failed"));
    env.docker.onNext("containerLogTail", () => {
      const created = [...env.docker.containers.values()][0];
      if (created) created.logs.push("exec /bin/sh: no such file or directory");
    });
    const task = await env.submitAndStart({ gpu: 1 });
    expect(task.status).toBe("terminated");
    expect(task.terminationReason).toBe("container_exited_with_error");
    expect(task.terminationMessage).toBe("exec /bin/sh: no such file or directory");
    // It has a container: the reconciler cleans up.
    expect(task.containerId).toEqual(expect.any(String));
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });
});

describe("TaskRunner shutdown", () => {
  it("stops a pull even when the shutdown lands before the pull request is sent", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    // What the shim's shutdown does (shim/shutdown.ts), while the start checks whether the image is present.
    env.docker.onNext("imageExists", () => {
      env.shutdownController.abort(new Error("shim shutting down"));
      env.runner.cancelPulls();
    });
    const task = await env.submit({ gpu: 1 });
    expect(await settlesWithin(env.runner.awaitStarts(), 1_000)).toBe(true);
    // Exactly one pull request, carrying the start's already-aborted signal (an empty list would
    // pass an every() check: this one fails if the pull is skipped or sent with a live signal).
    expect(env.docker.callsOf("pullImage").map((call) => call.signal?.aborted)).toEqual([true]);
    expect(env.docker.count("createContainer")).toBe(0);
    // Not a failure of the task: it stays in pulling and resumes after the restart.
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "pulling", startInFlight: false });
    expect(readState(task.taskDir).status).toBe("pulling");
  });
});

describe("TaskRunner.terminate", () => {
  it("aborts a pull in flight, and no container is created afterwards (R3)", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 3), signal);
    const submitted = await env.submit({ gpu: 1 });
    await waitFor(
      () => env.docker.count("pullImage") === 1 && env.ctx.store.mustGet(submitted.id).status === "pulling",
    );
    const pullSignal = env.docker.callsOf("pullImage")[0]?.signal;

    const answered = await env.runner.terminate(submitted.id, 10, "terminated_by_user", "cancelled by user");
    expect(answered.status).toBe("terminated");
    await env.runner.awaitStarts();
    await env.reconciler.tick();

    expect(pullSignal?.aborted).toBe(true);
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.docker.containers.size).toBe(0);
    const task = env.ctx.store.mustGet(submitted.id);
    expect(task.terminationReason).toBe("terminated_by_user");
    expect(task.terminationMessage).toBe("cancelled by user");
    expect(task.startInFlight).toBe(false);
    expect(task.cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("aborts a pull whose request has not even answered yet (R3)", async () => {
    env.docker.hangNext("pullImage");
    const submitted = await env.submit({ gpu: 2 });
    await waitFor(() => env.docker.count("pullImage") === 1);
    await env.runner.terminate(submitted.id, 0, "terminated_by_server", "");
    await env.runner.awaitStarts();
    expect(env.docker.count("createContainer")).toBe(0);
    const task = env.ctx.store.mustGet(submitted.id);
    expect(task.terminationReason).toBe("terminated_by_server");
    expect(task.cleanedUp).toBe(true);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("aborts the pull when the terminate lands before the pull request is sent (R3)", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const { config, auth } = taskConfig({ gpu: 1 });
    // The terminate arrives while the start checks whether the image is present.
    env.docker.onNext("imageExists", async () => {
      await env.runner.terminate(config.id, 0, "terminated_by_user", "");
    });
    await env.runner.submit(config, auth);
    expect(await settlesWithin(env.runner.awaitStarts(), 1_000)).toBe(true);
    // Exactly one pull request, and it carries the aborted signal.
    expect(env.docker.callsOf("pullImage").map((call) => call.signal?.aborted)).toEqual([true]);
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.ctx.store.mustGet(config.id)).toMatchObject({
      terminationReason: "terminated_by_user",
      startInFlight: false,
      cleanedUp: true,
    });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("keeps the first reason across repeated and concurrent calls, with one stop and one release (R2)", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    const release = vi.spyOn(env.ctx.gpuLock, "release");
    const [a, b] = await Promise.all([
      env.runner.terminate(task.id, 10, "terminated_by_user", "first"),
      env.runner.terminate(task.id, 0, "terminated_by_server", "second"),
    ]);
    const c = await env.runner.terminate(task.id, 0, "max_duration_exceeded", "third");
    for (const answer of [a, b, c]) {
      expect(answer.status).toBe("terminated");
      expect(answer.terminationReason).toBe("terminated_by_user");
      expect(answer.terminationMessage).toBe("first");
    }
    // One release call: a second one returning [] would not show in the released ids.
    expect(release).toHaveBeenCalledTimes(1);
    expect(releasedIds(release)).toEqual(task.gpuIds);
    expect(env.docker.mustFind(task.containerId!).state).toBe("exited");
    expect(env.docker.callsOf("stopContainer").map((call) => call.args)).toEqual([[task.containerId, 10]]);
  });

  it("records the exit code of the stopped container", async () => {
    const task = await env.submitAndStart();
    const after = await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(after.exitCode).toBe(137);
    expect(readState(task.taskDir).exit_code).toBe(137);
  });

  it("R12 keeps the intent when the stop fails (still running, its GPU held), and the reconciler finishes the stop later", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    env.docker.failNext("stopContainer", new Error("stop: deadline exceeded"));
    await expect(env.runner.terminate(task.id, 5, "terminated_by_user", "bye")).rejects.toThrow(
      /failed to stop container/,
    );
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "running",
      terminationReason: "terminated_by_user",
      cleanedUp: false,
    });
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    expect([readState(task.taskDir).status, readState(task.taskDir).termination_reason]).toEqual([
      "running",
      "terminated_by_user",
    ]);
    // A second terminate while the stop is pending keeps the first reason.
    env.docker.failNext("stopContainer", new Error("stop: deadline exceeded"));
    await expect(env.runner.terminate(task.id, 5, "terminated_by_server", "other")).rejects.toThrow(
      /failed to stop container/,
    );
    await env.reconciler.tick();
    expect(env.docker.mustFind(task.containerId!).state).toBe("exited");
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      cleanedUp: true,
      terminationReason: "terminated_by_user",
      terminationMessage: "bye",
      exitCode: 137,
    });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("R12 a terminate with a grace period: running (no reason shown) until the container has stopped, then terminated with the reason", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    let release!: () => void;
    const stopping = new Promise<void>((resolve) => (release = resolve));
    // The container takes its grace period to stop.
    env.docker.onNext("stopContainer", () => stopping);
    const answer = env.runner.terminate(task.id, 30, "terminated_by_user", "bye");
    await waitFor(() => env.docker.count("stopContainer") === 1);
    const during = env.ctx.store.mustGet(task.id);
    expect(during.status).toBe("running");
    // The intent is durable before the stop: a crash now ends with this reason after a restart.
    expect([readState(task.taskDir).status, readState(task.taskDir).termination_reason]).toEqual([
      "running",
      "terminated_by_user",
    ]);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    // The reconciler does not step in while the terminate holds the task.
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(task.id).status).toBe("running");
    release();
    const done = await answer;
    expect(done).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "bye",
      exitCode: 143,
    });
    expect(readState(task.taskDir)).toMatchObject({ status: "terminated", exit_code: 143, cleaned_up: true });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });
});

describe("TaskRunner.remove", () => {
  it("refuses a task that is not terminated with a TaskStateError", async () => {
    const task = await env.submitAndStart();
    const error = await env.runner.remove(task.id).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TaskStateError);
    expect((error as Error).message).toBe(`cannot remove task ${task.id} with running status`);
    expect(env.ctx.store.get(task.id)?.status).toBe("running");
    expect(env.docker.mustFind(task.containerId!).state).toBe("running");
    expect(env.docker.count("removeContainer")).toBe(0);
  });

  it("survives a concurrent terminate: container removed, GPUs released once, another task's GPUs kept", async () => {
    const task = await env.submitAndStart({ gpu: 2 });
    expect(task.gpuIds).toEqual(BOTH_GPUS);
    const release = vi.spyOn(env.ctx.gpuLock, "release");
    let reacquired: string[] = [];
    // Between the terminate's release and the remove's: another task takes the same GPUs.
    env.docker.onNext("removeContainer", () => {
      reacquired = env.ctx.gpuLock.acquire(2);
    });
    const [terminated, removed] = await Promise.allSettled([
      env.runner.terminate(task.id, 0, "terminated_by_user", ""),
      env.runner.remove(task.id),
    ]);
    expect(terminated.status).toBe("fulfilled");
    expect(removed.status).toBe("fulfilled");
    expect(reacquired).toEqual(BOTH_GPUS);
    expect(env.ctx.gpuLock.lockedIds()).toEqual(BOTH_GPUS);
    expect(releasedIds(release)).toEqual(BOTH_GPUS);
    expect(env.docker.find(task.containerId!)).toBeUndefined();
    expect(env.ctx.store.get(task.id)).toBeUndefined();
    expect(existsSync(task.taskDir)).toBe(false);
  });

  it("with remove first and terminate second, only the remove fails, and with a TaskStateError", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    const [removed, terminated] = await Promise.allSettled([
      env.runner.remove(task.id),
      env.runner.terminate(task.id, 0, "terminated_by_user", ""),
    ]);
    expect(removed.status === "rejected" ? removed.reason : undefined).toBeInstanceOf(TaskStateError);
    expect(terminated.status).toBe("fulfilled");
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "terminated", cleanedUp: true });
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("removes a task the reconciler is releasing only after that release, releasing once (R7)", async () => {
    const { task, container } = await env.seedTask({
      config: { volumes: [{ backend: "aws", name: "data", volume_id: "vol-0abc" }] },
    });
    env.commands.mounted.add(join(env.home, "volumes", "data"));
    let openGate = (): void => undefined;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    env.commands.script = (argv) => (argv[0] === "umount" ? gate.then(() => exited(0)) : undefined);
    env.docker.exit(container!.id, 0);

    const tick = env.reconciler.tick();
    await waitFor(() => env.commands.argvsOf("umount").length === 1);
    const removal = env.runner.remove(task.id);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(env.ctx.store.get(task.id)).toBeDefined();
    openGate();
    await Promise.all([tick, removal]);

    expect(env.commands.argvsOf("umount")).toHaveLength(1);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
    expect(env.docker.containers.size).toBe(0);
    expect(existsSync(task.taskDir)).toBe(false);
  });

  it("removes a container that was created but never recorded on the task (found by name)", async () => {
    const { task, container } = await env.seedTask({
      status: "terminated",
      containerState: "created",
      withContainerId: false,
      cleanedUp: true,
    });
    await env.runner.remove(task.id);
    expect(env.docker.find(container!.id)).toBeUndefined();
    expect(env.ctx.store.get(task.id)).toBeUndefined();
  });
});

describe("TaskRunner.release", () => {
  it("is idempotent: volumes, host keys and GPUs are released once however often it is called", async () => {
    const key = sshEd25519PublicKey("deploy@ci");
    const { task } = await env.seedTask({
      status: "terminated",
      containerState: "exited",
      gpus: 2,
      config: {
        host_ssh_user: "ubuntu",
        host_ssh_keys: [key],
        volumes: [{ backend: "aws", name: "data", volume_id: "vol-0abc" }],
      },
    });
    const authorizedKeys = join(env.userHome("ubuntu"), ".ssh", "authorized_keys");
    // The key was added while the task ran; a terminated task no longer claims it.
    await env.ctx.hostKeys.reconcile(new Map([["ubuntu", [key]]]));
    expect(readFileSync(authorizedKeys, "utf8")).toContain(key.split(" ")[1]);
    expect(env.runner.hostKeysByUser().get("ubuntu")).toBeUndefined();
    env.commands.mounted.add(join(env.home, "volumes", "data"));
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile");
    const release = vi.spyOn(env.ctx.gpuLock, "release");

    await Promise.all([env.runner.release(task.id), env.runner.release(task.id)]);
    await env.runner.release(task.id);

    expect(env.commands.argvsOf("umount")).toEqual([["umount", "-qf", join(env.home, "volumes", "data")]]);
    expect(reconcile).toHaveBeenCalledTimes(1);
    expect(releasedIds(release)).toEqual(BOTH_GPUS);
    expect(env.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(readFileSync(authorizedKeys, "utf8")).not.toContain(key.split(" ")[1]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ cleanedUp: true, gpuIds: [] });
    expect(readState(task.taskDir).cleaned_up).toBe(true);
  });

  it("fails only the tasks of a user whose ~/.ssh is broken, not another user's", async () => {
    const broken = await env.submitAndStart({
      host_ssh_user: "mallory",
      host_ssh_keys: [sshEd25519PublicKey("m@x")],
    });
    expect(broken.status).toBe("running");
    // mallory's ~/.ssh becomes a symlink while her task lives: every later reconcile fails for her.
    await rm(join(env.userHome("mallory"), ".ssh"), { recursive: true });
    await symlink(env.home, join(env.userHome("mallory"), ".ssh"));
    const key = sshEd25519PublicKey("alice@ci");
    const fine = await env.submitAndStart({ host_ssh_user: "alice", host_ssh_keys: [key] });
    expect(fine.status).toBe("running");
    expect(readFileSync(join(env.userHome("alice"), ".ssh", "authorized_keys"), "utf8")).toContain(
      key.split(" ")[1],
    );
    const again = await env.submitAndStart({
      host_ssh_user: "mallory",
      host_ssh_keys: [sshEd25519PublicKey("m2@x")],
    });
    expect(again.status).toBe("terminated");
    expect(again.terminationMessage).toMatch(
      /^host ssh keys: reconcile authorized_keys of mallory: .* is a symlink/,
    );
  });

  it("keeps a host key another live task still needs (R6)", async () => {
    const key = sshEd25519PublicKey("shared@ci");
    const body = { host_ssh_user: "ubuntu", host_ssh_keys: [key] };
    const first = await env.submitAndStart(body);
    const second = await env.submitAndStart(body);
    const authorizedKeys = join(env.userHome("ubuntu"), ".ssh", "authorized_keys");
    expect(readFileSync(authorizedKeys, "utf8")).toContain(key.split(" ")[1]);
    await env.runner.terminate(first.id, 0, "terminated_by_user", "");
    expect(readFileSync(authorizedKeys, "utf8")).toContain(key.split(" ")[1]);
    await env.runner.terminate(second.id, 0, "terminated_by_user", "");
    expect(readFileSync(authorizedKeys, "utf8")).not.toContain(key.split(" ")[1]);
  });
});

describe("TaskRunner.reconcileHostKeys with a degraded task alive", () => {
  it("revokes no key while a task whose keys are unknown lives, and revokes once it ended", async () => {
    const key = sshEd25519PublicKey("gone@ci");
    const task = await env.submitAndStart({ host_ssh_user: "ubuntu", host_ssh_keys: [key] });
    const authorizedKeys = join(env.userHome("ubuntu"), ".ssh", "authorized_keys");
    expect(readFileSync(authorizedKeys, "utf8")).toContain(key.split(" ")[1]);
    // A restored task whose state file was lost: its keys may be this very key.
    const { task: degraded } = await env.seedTask();
    env.ctx.store.modify(degraded.id, (d) => (d.degraded = true));
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(readFileSync(authorizedKeys, "utf8")).toContain(key.split(" ")[1]);
    await env.runner.terminate(degraded.id, 0, "terminated_by_user", "");
    await env.runner.reconcileHostKeys(["ubuntu"]);
    expect(readFileSync(authorizedKeys, "utf8")).not.toContain(key.split(" ")[1]);
  });
});
