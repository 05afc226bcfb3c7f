import { existsSync, readFileSync } from "node:fs";
import { mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID } from "../docker/docker-client.js";
import { TaskDirs } from "../state/task-dirs.js";
import { encodeTaskState, TASK_STATE_FILE, writeTaskState } from "../state/task-state-file.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import { TaskStore } from "../tasks/task-store.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { hostConfigFor, TWO_AMD_GPUS } from "../testing/fixtures.js";
import { pullStream, stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { makeContext, TEST_HOME_ID, type TestEnv } from "../testing/test-context.js";
import { waitFor } from "../testing/wait-for.js";
import { armFailpoints } from "./failpoints.js";
import { ContainerOwnership } from "./ownership.js";
import { REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import { recoveredVolumes } from "./restore-legacy.js";
import { restoreTasks } from "./restore.js";

const BOTH_GPUS = ["/dev/dri/renderD128", "/dev/dri/renderD129"];

let env: TestEnv;
const extraEnvs: TestEnv[] = [];

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  armFailpoints(undefined);
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

  it("restores from the reads the start began (the scan and the list), asking neither again", async () => {
    const task = await env.submitAndStart({});
    const next = await restart();
    const scanning = next.ctx.dirs.scan();
    const listing = next.ctx.docker.listTaskContainers();
    env.docker.resetCalls();
    const report = await restoreTasks(next.ctx, { scanning, listing });
    expect(report.restored).toBe(1);
    expect(next.ctx.store.mustGet(task.id).status).toBe("running");
    expect(env.docker.count("listTaskContainers")).toBe(0);
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

  it("R12 a terminate's intent cut by a crash (running beside a reason): restored running with its GPUs, the reconciler stops it and ends it with the requested reason", async () => {
    const task = await env.submitAndStart({ gpu: 2 });
    // The first shim recorded the intent and died before its stop (kill at after-terminate-intent).
    env.docker.hangNext("stopContainer");
    void env.runner.terminate(task.id, 30, "terminated_by_user", "stop it").catch(() => undefined);
    await waitFor(() => env.docker.count("stopContainer") === 1);
    expect([readState(task.taskDir).status, readState(task.taskDir).termination_reason]).toEqual([
      "running",
      "terminated_by_user",
    ]);
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.changed).not.toContain(task.id);
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "running",
      terminationReason: "terminated_by_user",
    });
    expect(next.ctx.gpuLock.lockedIds()).toEqual(BOTH_GPUS);
    await next.reconciler.tick();
    expect(env.docker.mustFind(task.containerId!).state).toBe("exited");
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "stop it",
      exitCode: 137,
      cleanedUp: true,
    });
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("R12 a terminate's intent whose container stopped before the crash: ended at the first tick with the requested reason, the exit code the container's", async () => {
    const task = await env.submitAndStart();
    armFailpoints("after-stop-before-persist=1*error(boom)");
    await expect(env.runner.terminate(task.id, 10, "terminated_by_server", "gone")).rejects.toThrow("boom");
    expect(readState(task.taskDir)).toMatchObject({
      status: "running",
      termination_reason: "terminated_by_server",
    });
    const next = await restart();
    await restoreTasks(next.ctx);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_server",
      terminationMessage: "gone",
      exitCode: 143,
      cleanedUp: true,
    });
    expect(env.docker.count("stopContainer")).toBe(1);
  });

  it("R5: of two restored containers claiming one GPU, the first holds it; the second is flagged, and its end frees nothing", async () => {
    const holder = await env.submitAndStart({ gpu: 1 });
    const other = await env.submitAndStart({ gpu: 1 });
    expect(holder.gpuIds).toEqual(["/dev/dri/renderD128"]);
    // While the shim is down, the other container is made to claim the holder's GPU.
    env.docker.containers.get(other.containerId!)!.hostConfig = hostConfigFor(TWO_AMD_GPUS, holder.gpuIds);
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(holder.id).gpuIds).toEqual(holder.gpuIds);
    expect(next.ctx.store.mustGet(other.id).gpuIds).toEqual([]);
    expect(next.ctx.gpuLock.lockedIds()).toEqual(holder.gpuIds);
    expect(logged(lines, "GPU claimed by two restored containers; left with the task that holds it")).toEqual(
      [expect.objectContaining({ taskId: other.id, gpus: holder.gpuIds, heldBy: [holder.id] })],
    );

    env.docker.exit(other.containerId!, 0);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(other.id).status).toBe("terminated");
    expect(next.ctx.gpuLock.lockedIds()).toEqual(holder.gpuIds);
    env.docker.exit(holder.containerId!, 0);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(holder.id).status).toBe("terminated");
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
    expect(report.quarantineHeld).toBe(1);
    const [kept = ""] = report.quarantined;
    expect(kept.startsWith(join(env.home, "quarantine", "broken-0123abcd."))).toBe(true);
    expect(existsSync(join(badDir, TASK_STATE_FILE))).toBe(false);
    expect(await readFile(kept, "utf8")).toBe("{not json");
    expect(await readFile(kept.replace(/task\.json$/, "note.json"), "utf8")).toContain(
      "task state is not valid JSON",
    );
    expect(next.ctx.store.mustGet(good.id).status).toBe("running");
  });

  it("restores a task whose stored config today's submit rules refuse, with its config and reason", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "by hand");
    const file = join(task.taskDir, TASK_STATE_FILE);
    const stored = JSON.parse(await readFile(file, "utf8")) as { config: Record<string, unknown> };
    // An env name an older release accepted and the submit now refuses.
    stored.config.env = { "legacy-name": "1" };
    expect(() => parseTaskConfig(stored.config)).toThrow(/invalid env name/);
    await writeFile(file, JSON.stringify(stored));
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined).toEqual([]);
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "by hand",
      config: { image_name: task.config.image_name, env: { "legacy-name": "1" } },
    });
  });

  it("leaves a task.json of a newer version untouched, and shows its task read-only as far as it can be read", async () => {
    const newerDir = join(env.home, "runners", "newer-89abcdef");
    await mkdir(newerDir, { recursive: true });
    const text = JSON.stringify({ version: 2, id: "from-the-future", config: { id: "from-the-future" } });
    await writeFile(join(newerDir, TASK_STATE_FILE), text);
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.skippedNewer).toEqual([newerDir]);
    expect(report.quarantined).toEqual([]);
    expect(report.resumed).toEqual([]);
    expect(report.changed).toEqual([]);
    expect(await readFile(join(newerDir, TASK_STATE_FILE), "utf8")).toBe(text);
    expect(await readdir(newerDir)).toEqual([TASK_STATE_FILE]);
    expect(next.ctx.store.get("from-the-future")).toMatchObject({
      status: "pending",
      held: { kind: "newer-format", version: 2 },
      config: { name: "newer", image_name: "unknown" },
      containerName: "newer-89abcdef",
      taskDir: newerDir,
    });
    expect(next.ctx.dirs.heldBy(newerDir)).toEqual({ kind: "newer-format", version: 2 });
  });
});

/** Parsed pino lines of a capturing logger whose `msg` is `msg`. */
const logged = (lines: readonly string[], msg: string): Record<string, unknown>[] =>
  lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === msg);

const ownLabels = (taskId: string): Record<string, string> => ({
  [LABEL_IS_TASK]: "true",
  [LABEL_TASK_ID]: taskId,
  [LABEL_OWNER]: TEST_HOME_ID,
});
const bareLabels = (taskId: string): Record<string, string> => ({
  [LABEL_IS_TASK]: "true",
  [LABEL_TASK_ID]: taskId,
});

describe("restoreTasks: what it reports and logs", () => {
  it("reports nothing ignored, adopted, changed or resumed for an ordinary restart, and logs the counts", async () => {
    const task = await env.submitAndStart({});
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    const report = await restoreTasks(next.ctx);
    expect(report).toMatchObject({
      restored: 1,
      resumed: [],
      quarantined: [],
      skippedNewer: [],
      ignoredContainers: [],
      foreignContainers: [],
      adoptedUnowned: [],
      swept: [],
      changed: [],
    });
    expect(next.ctx.store.mustGet(task.id).taskDir).toBe(task.taskDir);
    expect(logged(lines, "tasks restored")).toEqual([
      expect.objectContaining({
        restored: 1,
        resumed: 0,
        quarantined: 0,
        skippedNewer: 0,
        foreign: 0,
        adoptedUnowned: 0,
      }),
    ]);
    expect(logged(lines, "leftover task dirs swept")).toEqual([]);
  });

  it("sweeps a leftover dir (only an empty runner/) and logs it", async () => {
    const leftover = join(env.home, "runners", "cut-0123abcd");
    await mkdir(join(leftover, "runner"), { recursive: true });
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    const report = await restoreTasks(next.ctx);
    expect(report.swept).toEqual([leftover]);
    expect(existsSync(leftover)).toBe(false);
    expect(logged(lines, "leftover task dirs swept")).toEqual([
      expect.objectContaining({ swept: [leftover] }),
    ]);
  });

  it("logs a newer-format state left alone and a corrupt one quarantined, each with its dir", async () => {
    const newerDir = join(env.home, "runners", "newer-89abcdef");
    await mkdir(newerDir, { recursive: true });
    await writeFile(join(newerDir, TASK_STATE_FILE), JSON.stringify({ version: 2, id: "x" }));
    const badDir = join(env.home, "runners", "broken-0123abcd");
    await mkdir(badDir, { recursive: true });
    await writeFile(join(badDir, TASK_STATE_FILE), "{not json");
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    const report = await restoreTasks(next.ctx);
    const newer = logged(lines, "task state of a newer format left alone");
    expect(newer).toHaveLength(1);
    expect(newer[0]).toMatchObject({ dir: newerDir, err: { type: "UnsupportedTaskStateVersionError" } });
    const corrupt = logged(lines, "corrupt task state quarantined");
    expect(corrupt).toHaveLength(1);
    expect(corrupt[0]).toMatchObject({
      dir: badDir,
      quarantinedAs: report.quarantined[0],
      err: { type: "CorruptTaskStateError" },
    });
  });

  it("restores one task of two state files with the same id, and logs the other as a duplicate", async () => {
    const { task } = await env.seedTask({ status: "pending", containerState: "none" });
    const twin = join(env.home, "runners", "twin-0123abcd");
    await mkdir(twin, { recursive: true });
    await writeFile(join(twin, TASK_STATE_FILE), encodeTaskState({ ...task, taskDir: twin }, "boot"));
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    const report = await restoreTasks(next.ctx);
    expect(report.restored).toBe(1);
    const restoredDir = next.ctx.store.mustGet(task.id).taskDir;
    expect([task.taskDir, twin]).toContain(restoredDir);
    expect(logged(lines, "duplicate task state ignored")).toEqual([
      expect.objectContaining({ taskId: task.id, dir: restoredDir === twin ? task.taskDir : twin }),
    ]);
  });

  it("ignores our container without a task id, and a second container of one task (logged)", async () => {
    const task = await env.submitAndStart({});
    env.docker.addContainer({ name: "no-id-1", labels: ownLabels("") });
    const second = env.docker.addContainer({ name: "second-1", labels: ownLabels(task.id) });
    const { log, lines } = capturingLogger();
    const next = await restart({ log });
    const report = await restoreTasks(next.ctx);
    expect(report.ignoredContainers.sort()).toEqual(["no-id-1", "second-1"]);
    expect(report.restored).toBe(1);
    expect(next.ctx.store.mustGet(task.id).containerId).toBe(task.containerId);
    expect(logged(lines, "second container for one task ignored")).toEqual([
      expect.objectContaining({ taskId: task.id, container: second.name }),
    ]);
  });
});

describe("restoreTasks: the status of a task with a container", () => {
  it("a start cut after its container started: running, and reported changed (not resumed)", async () => {
    const { task } = await env.seedTask({ status: "creating", containerState: "running" });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).status).toBe("running");
    expect(report.changed).toEqual([task.id]);
    expect(report.resumed).toEqual([]);
  });

  it("a start cut between create and start: creating, resumed and not changed, without ports", async () => {
    const { task } = await env.seedTask({ status: "pulling", containerState: "created" });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored.status).toBe("creating");
    expect(restored.ports).toBeUndefined();
    expect(report.resumed).toEqual([task.id]);
    expect(report.changed).toEqual([task.id]);
  });

  it("a running task.json with a container only created stays running (the reconciler says it never started)", async () => {
    const { task } = await env.seedTask({ status: "running", containerState: "created" });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).status).toBe("running");
    expect(report.resumed).toEqual([]);
    expect(report.changed).toEqual([]);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(task.id).terminationMessage).toBe("container was not started");
  });

  it("a cleaned-up terminated task holds no GPU, even though its container still shows them", async () => {
    const { task } = await env.seedTask({
      status: "terminated",
      containerState: "exited",
      cleanedUp: true,
      gpus: 2,
    });
    env.ctx.gpuLock.release(task.gpuIds);
    const next = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).gpuIds).toEqual([]);
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
  });

  it("our container without a task.json: restored degraded from the container, in its dir when it exists", async () => {
    const kept = await env.submitAndStart({ name: "keptdir" });
    const gone = await env.submitAndStart({ name: "gonedir" });
    await rm(join(kept.taskDir, TASK_STATE_FILE));
    await rm(gone.taskDir, { recursive: true });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.adoptedUnowned).toEqual([]);
    expect(report.changed).toEqual([]);
    expect(next.ctx.store.mustGet(kept.id)).toMatchObject({
      status: "running",
      taskDir: kept.taskDir,
      terminationMessage: "",
      degraded: true,
      containerId: kept.containerId,
    });
    expect(next.ctx.store.mustGet(kept.id).config).toMatchObject({ name: "keptdir", image_name: "unknown" });
    expect(next.ctx.store.mustGet(gone.id)).toMatchObject({ taskDir: "", degraded: true });
  });

  it("a container whose dir holds a newer-format state: shown as held, keys known, its credentials kept", async () => {
    const task = await env.submitAndStart({});
    await writeFile(
      join(task.taskDir, TASK_STATE_FILE),
      JSON.stringify({ version: 2, id: task.id, config: { id: task.id } }),
    );
    await writeFile(join(task.taskDir, REGISTRY_AUTH_FILE), '{"username":"u","password":"p"}');
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.skippedNewer).toEqual([task.taskDir]);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored).toMatchObject({
      held: { kind: "newer-format", version: 2 },
      taskDir: task.taskDir,
      status: "running",
    });
    expect(restored.degraded).toBeUndefined();
    expect(existsSync(join(task.taskDir, REGISTRY_AUTH_FILE))).toBe(true);
  });
});

describe("restoreTasks: a task.json whose container is gone", () => {
  it("keeps a terminated task terminated, with its reason, message and exit code, not resumed", async () => {
    const task = await env.submitAndStart({});
    await env.runner.terminate(task.id, 0, "terminated_by_user", "user asked");
    env.docker.remove(task.containerId!);
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "user asked",
      exitCode: 137,
      cleanedUp: true,
    });
    expect(report.resumed).toEqual([]);
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(task.id).terminationReason).toBe("terminated_by_user");
  });

  it("marks a task that ran in an earlier boot as ended across a reboot, not one still to start", async () => {
    const ran = await env.submitAndStart({});
    env.docker.remove(ran.containerId!);
    const cut = await env.seedTask({ status: "pending", containerState: "none" });
    const next = await restart({ bootId: "22222222-next-boot" });
    const report = await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(ran.id).acrossReboot).toBe(true);
    expect(next.ctx.store.mustGet(cut.task.id).acrossReboot).toBeUndefined();
    expect(report.resumed).toEqual([cut.task.id]);
  });
});

describe("restoreTasks: times", () => {
  it("keeps the times of task.json, even when the container reports another start", async () => {
    const task = await env.submitAndStart({});
    env.docker.mustFind(task.containerId!).startedAt = "2020-01-01T00:00:00.000Z";
    const next = await restart();
    await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored.createdAt).toBe(task.createdAt);
    expect(restored.startedAt).toBe(task.startedAt);
    expect(restored.finishedAt).toBeUndefined();
  });

  it("a task.json without times (dstack-shim's): start time from the container, none when it never started", async () => {
    const { task } = await env.seedTask({});
    const { task: never } = await env.seedTask({ containerState: "exited" });
    const legacy = (t: typeof task): string => {
      const {
        created_at: _c,
        started_at: _s,
        finished_at: _f,
        ...rest
      } = JSON.parse(encodeTaskState(t, "boot")) as Record<string, unknown>;
      return JSON.stringify(rest);
    };
    await writeFile(join(task.taskDir, TASK_STATE_FILE), legacy(task));
    await writeFile(join(never.taskDir, TASK_STATE_FILE), legacy(never));
    env.docker.mustFind(task.containerName).startedAt = "2026-02-03T04:05:06.000Z";
    env.docker.mustFind(never.containerName).startedAt = "0001-01-01T00:00:00Z";
    const next = await restart();
    await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored.startedAt).toBe(Date.parse("2026-02-03T04:05:06.000Z"));
    expect(restored.createdAt).toBeUndefined();
    expect(next.ctx.store.mustGet(never.id).startedAt).toBeUndefined();
  });

  it("keeps the finish time of a terminated task.json", async () => {
    const task = await env.submitAndStart({});
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    const finished = env.ctx.store.mustGet(task.id).finishedAt;
    expect(finished).toBeGreaterThan(0);
    const next = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(task.id).finishedAt).toBe(finished);
  });
});

describe("restoreTasks: a task the store refuses", () => {
  it("is logged as not restored and gives back the GPUs it locked", async () => {
    const task = await env.submitAndStart({ gpu: 2 });
    const store = new TaskStore();
    store.add({ ...task, gpuIds: [] });
    const { log, lines } = capturingLogger();
    const next = await restart({ log, store });
    await restoreTasks(next.ctx);
    expect(next.ctx.gpuLock.lockedIds()).toEqual([]);
    const refused = logged(lines, "task not restored");
    expect(refused).toHaveLength(1);
    expect(refused[0]).toMatchObject({ taskId: task.id, err: { type: "TaskExistsError" } });
  });
});

describe("restoreTasks --adopt-unowned", () => {
  const adopting = (): ContainerOwnership => new ContainerOwnership(TEST_HOME_ID, true);

  it("derives the config from the container: its name, its volumes (never formatted), and logs the adoption", async () => {
    const root = env.ctx.params.volumeMountRoot;
    env.docker.addContainer({
      name: "legacy-0badf00d",
      labels: bareLabels("legacy-task"),
      mounts: [{ source: join(root, "data"), destination: "/data" }],
    });
    const { log, lines } = capturingLogger();
    const next = await restart({ ownership: adopting(), log });
    const report = await restoreTasks(next.ctx);
    const task = next.ctx.store.mustGet("legacy-task");
    expect(task.config.name).toBe("legacy");
    expect(task.config.image_name).toBe("unknown");
    expect(task.config.volumes).toEqual([
      { name: "data", backend: "", volume_id: "", init_fs: false, device_name: "" },
    ]);
    expect(task.config.volume_mounts).toEqual([{ name: "data", path: "/data" }]);
    expect(task.terminationMessage).toBe("");
    expect(task.taskDir).toBe(next.ctx.dirs.dirFor("legacy-0badf00d"));
    expect(report.changed).toEqual(["legacy-task"]);
    expect(
      logged(lines, "container without owner label adopted (--adopt-unowned); its host keys are unknown"),
    ).toEqual([
      expect.objectContaining({ taskId: "legacy-task", container: "legacy-0badf00d", volumes: ["data"] }),
    ]);
  });

  it("strips only the trailing hash of the name, drops mounts with invalid names, and leaves an invalid task label alone", async () => {
    const root = env.ctx.params.volumeMountRoot;
    env.docker.addContainer({ name: "job-deadbeef-12345678", labels: bareLabels("a-task") });
    env.docker.addContainer({ name: "-0badf00d", labels: bareLabels("b-task") });
    env.docker.addContainer({
      name: "vols-0badf00d",
      labels: bareLabels("c-task"),
      mounts: [{ source: join(root, "bad name"), destination: "/bad" }],
    });
    env.docker.addContainer({ name: "odd-0badf00d", labels: bareLabels("odd id!") });
    const next = await restart({ ownership: adopting() });
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet("a-task").config.name).toBe("job-deadbeef");
    expect(next.ctx.store.mustGet("b-task").config.name).toBe("task");
    const vols = next.ctx.store.mustGet("c-task").config;
    expect({ id: vols.id, name: vols.name, volumes: vols.volumes }).toEqual({
      id: "c-task",
      name: "vols",
      volumes: [],
    });
    // Adopted, its task.json would carry an id the next start could not match to it: not adopted.
    expect(next.ctx.store.get("odd id!")).toBeUndefined();
  });

  it("an adopted container with a non-UUID label survives two restarts with its task.json read back", async () => {
    // A name longer than the submit allows (Docker takes it): the config used to fall back to the
    // id "legacy-task", and the next start quarantined the task.json written for it.
    env.docker.addContainer({ name: `${"n".repeat(120)}-0badf00d`, labels: bareLabels("my-job.1") });
    for (let start = 0; start < 3; start++) {
      const next = await restart({ ownership: adopting() });
      const report = await restoreTasks(next.ctx);
      expect(report.quarantined).toEqual([]);
      const task = next.ctx.store.mustGet("my-job.1");
      expect(task.config.id).toBe("my-job.1");
      await writeTaskState(task.taskDir, task, "boot");
    }
  });

  it("an adopted container whose dir cannot be made: restored without a dir, logged, not persisted", async () => {
    env.docker.addContainer({ name: "nodir-0badf00d", labels: bareLabels("nodir-task") });
    const dirs = new TaskDirs(env.home);
    dirs.make = () => Promise.reject(new Error("EACCES: no dir"));
    const { log, lines } = capturingLogger();
    const next = await restart({ ownership: adopting(), dirs, log });
    const report = await restoreTasks(next.ctx);
    expect(report.adoptedUnowned).toEqual(["nodir-0badf00d"]);
    expect(report.changed).toEqual([]);
    expect(next.ctx.store.mustGet("nodir-task")).toMatchObject({ taskDir: "", degraded: true });
    expect(logged(lines, "no task dir for an adopted container")).toEqual([
      expect.objectContaining({ taskId: "nodir-task", container: "nodir-0badf00d" }),
    ]);
  });
});

describe("recoveredVolumes", () => {
  it("names one volume per direct child of the mount root, once, skipping dot dirs and anything else", () => {
    const root = env.ctx.params.volumeMountRoot;
    const mounts = [
      { source: join(root, "data"), destination: "/data" },
      { source: join(root, "data"), destination: "/again" },
      { source: join(root, ".hidden"), destination: "/hidden" },
      { source: join(root, "a", "deep"), destination: "/deep" },
      { source: `${root}/./model`, destination: "/model" },
      { source: "/etc/hosts", destination: "/etc/hosts" },
    ];
    const inspect = { mounts } as unknown as Parameters<typeof recoveredVolumes>[1];
    expect(recoveredVolumes(env.ctx, inspect)).toEqual([
      { name: "data", path: "/data" },
      { name: "model", path: "/model" },
    ]);
    expect(recoveredVolumes(env.ctx, undefined)).toEqual([]);
    const atRoot = { ...env.ctx, params: { ...env.ctx.params, volumeMountRoot: "/" } };
    const rootMount = { mounts: [{ source: "/", destination: "/host" }] } as unknown as Parameters<
      typeof recoveredVolumes
    >[1];
    expect(recoveredVolumes(atRoot, rootMount)).toEqual([]);
  });
});
