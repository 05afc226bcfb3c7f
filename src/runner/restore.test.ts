import { existsSync, readFileSync } from "node:fs";
import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { pullStream, stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { waitFor } from "../testing/wait-for.js";
import { restoreTasks } from "./restore.js";

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

/** A second shim over the same home and the same engine (the first one is gone). */
async function restart(overrides: Parameters<typeof makeContext>[0] = {}): Promise<TestEnv> {
  const next = await makeContext({ home: env.home, docker: env.docker, ...overrides });
  extraEnvs.push(next);
  return next;
}

const readState = (taskDir: string): Record<string, unknown> =>
  JSON.parse(readFileSync(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;

describe("restoreTasks", () => {
  it("adopts a running container as running and re-locks its GPUs, touching nothing", async () => {
    const task = await env.submitAndStart({ gpu: 2 });
    const next = await restart();
    env.docker.resetCalls();
    const report = await restoreTasks(next.ctx);
    expect(report.restored).toBe(1);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored).toMatchObject({
      status: "running",
      containerId: task.containerId,
      containerName: task.containerName,
      taskDir: task.taskDir,
      cleanedUp: false,
      startInFlight: false,
    });
    expect(restored.config).toEqual(task.config);
    expect([...restored.gpuIds].sort()).toEqual(BOTH_GPUS);
    expect(next.ctx.gpuLock.lockedIds()).toEqual(BOTH_GPUS);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(task.id).status).toBe("running");
    for (const method of ["createContainer", "startContainer", "stopContainer", "removeContainer"] as const) {
      expect(env.docker.count(method)).toBe(0);
    }
  });

  it("on a host without GPUs, restores tasks with their state from the list alone (no inspect), ports included", async () => {
    const noGpus = { vendor: "none" as const, gpus: [] };
    const first = await restart({ inventory: noGpus });
    const task = await first.submitAndStart({});
    const container = env.docker.containers.get(task.containerId!);
    if (container) container.ports = [{ host: 32768, container: 10999 }];
    const next = await restart({ inventory: noGpus });
    env.docker.resetCalls();
    await restoreTasks(next.ctx);
    expect(env.docker.count("inspectContainer")).toBe(0);
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "running",
      ports: [{ host: 32768, container: 10999 }],
    });
    // With GPUs, which ones a container holds is only in its inspect.
    const withGpus = await restart();
    env.docker.resetCalls();
    await restoreTasks(withGpus.ctx);
    expect(env.docker.count("inspectContainer")).toBe(1);
  });

  it("finalizes a container that exited while the shim was down, with its real exit code", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    env.docker.exit(task.containerId!, 42, { logs: ["Traceback", "ValueError: bad input"] });
    const next = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
    await next.reconciler.tick();
    const after = next.ctx.store.mustGet(task.id);
    expect(after.terminationReason).toBe("container_exited_with_error");
    expect(after.exitCode).toBe(42);
    expect(after.terminationMessage).toBe("Traceback\nValueError: bad input");
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(readState(task.taskDir)).toMatchObject({ exit_code: 42, cleaned_up: true });
  });

  it("finalizes a running task.json whose container is gone as executor_error with exit code null", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    env.docker.remove(task.containerId!);
    const next = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).status).toBe("running");
    await next.reconciler.tick();
    const after = next.ctx.store.mustGet(task.id);
    expect(after.terminationReason).toBe("executor_error");
    expect(after.terminationMessage).toBe("container not found");
    expect(after.exitCode).toBeNull();
    expect(readState(task.taskDir).exit_code).toBeNull();
  });

  it("keeps the reason of a terminated task.json", async () => {
    const task = await env.submitAndStart({ gpu: 1 });
    await env.runner.terminate(task.id, 0, "terminated_by_user", "user asked");
    const next = await restart();
    await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "user asked",
      cleanedUp: true,
      exitCode: 137,
    });
    // Cleaned up before the restart: its GPUs are not locked again.
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(task.id).terminationReason).toBe("terminated_by_user");
  });

  it("finishes a terminate cut by a crash: stops the container and releases the re-locked GPUs", async () => {
    const { task, container } = await env.seedTask({
      status: "terminated",
      terminationReason: "terminated_by_server",
      gpus: 2,
    });
    const next = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).status).toBe("terminated");
    expect(next.ctx.gpuLock.lockedIds()).toEqual(BOTH_GPUS);
    await next.reconciler.tick();
    expect(env.docker.mustFind(container!.id).state).toBe("exited");
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      terminationReason: "terminated_by_server",
      cleanedUp: true,
    });
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("resumes a task cut in pulling and starts it without duplicating anything", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    const submitted = await env.submit({ gpu: 1 });
    await waitFor(() => env.docker.count("pullImage") === 1);
    env.shutdownController.abort(new Error("shim shutting down"));
    await env.runner.awaitStarts();
    expect(readState(submitted.taskDir).status).toBe("pulling");

    env.docker.pullScript = () => pullStream(SUCCESSFUL_PULL_LINES);
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.resumed).toEqual([submitted.id]);
    expect(next.ctx.store.mustGet(submitted.id).status).toBe("pulling");
    next.runner.startInBackground(submitted.id);
    await next.runner.awaitStarts();
    expect(next.ctx.store.mustGet(submitted.id).status).toBe("running");
    expect(env.docker.count("createContainer")).toBe(1);
    expect(next.ctx.gpuLock.lockedIds()).toEqual(["/dev/dri/renderD128"]);
  });

  it("resumes a task cut between create and start by adopting its created container", async () => {
    const { task, container } = await env.seedTask({
      status: "creating",
      containerState: "created",
      gpus: 1,
    });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.resumed).toEqual([task.id]);
    next.runner.startInBackground(task.id);
    await next.runner.awaitStarts();
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", containerId: container!.id });
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.docker.containers.size).toBe(1);
    expect(next.ctx.gpuLock.lockedIds()).toEqual(task.gpuIds);
  });

  it("after a reboot, blames it only for containers that ran in the earlier boot (D7)", async () => {
    const ran = await env.submitAndStart({});
    const created = await env.seedTask({ status: "creating", containerState: "created" });
    const cut = await env.seedTask({ status: "pending", containerState: "none" });
    env.docker.exit(ran.containerId!, 137, { logs: ["last line"] });
    const sameBoot = await restart();
    await restoreTasks(sameBoot.ctx);
    expect(sameBoot.ctx.store.mustGet(ran.id).acrossReboot).toBeUndefined();

    const next = await restart({ bootId: "11111111-next-boot" });
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(ran.id).acrossReboot).toBe(true);
    expect(next.ctx.store.mustGet(created.task.id).acrossReboot).toBeUndefined();
    expect(next.ctx.store.mustGet(cut.task.id).acrossReboot).toBeUndefined();
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(ran.id).terminationMessage).toBe(
      "the host rebooted while the task was running (exit code 137)\nlast line",
    );
  });

  it("quarantines a corrupt task.json and goes on restoring the others", async () => {
    const good = await env.submitAndStart();
    const badDir = join(env.home, "runners", "broken-0123abcd");
    await mkdir(badDir, { recursive: true });
    await writeFile(join(badDir, TASK_STATE_FILE), "{not json");
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined).toHaveLength(1);
    expect(report.quarantined[0]).toMatch(/task\.json\.quarantined-/);
    expect(existsSync(join(badDir, TASK_STATE_FILE))).toBe(false);
    const names = await readdir(badDir);
    const kept = names.find((n) => n.startsWith(`${TASK_STATE_FILE}.quarantined-`));
    expect(kept).toBeDefined();
    expect(await readFile(join(badDir, kept ?? ""), "utf8")).toBe("{not json");
    expect(next.ctx.store.mustGet(good.id).status).toBe("running");
  });

  it("leaves a task.json of a newer version untouched", async () => {
    const newerDir = join(env.home, "runners", "newer-89abcdef");
    await mkdir(newerDir, { recursive: true });
    const text = JSON.stringify({ version: 2, id: "from-the-future", config: { id: "from-the-future" } });
    await writeFile(join(newerDir, TASK_STATE_FILE), text);
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.skippedNewer).toEqual([newerDir]);
    expect(report.quarantined).toEqual([]);
    expect(await readFile(join(newerDir, TASK_STATE_FILE), "utf8")).toBe(text);
    expect(await readdir(newerDir)).toEqual([TASK_STATE_FILE]);
    expect(next.ctx.store.get("from-the-future")).toBeUndefined();
  });
});
