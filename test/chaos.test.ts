import { existsSync } from "node:fs";
import { readdir, readFile, stat, truncate, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  ChaosHost,
  FIXTURE_GPUS,
  keyBlob,
  LABEL_IS_TASK,
  LABEL_TASK_ID,
  makeHostKey,
} from "./support/chaos-host.js";
import { Scenario, type TaskOptions, waitCommand, WAIT_TASK_TAIL } from "./support/chaos-scenario.js";
import { ChaosStats } from "./support/chaos-stats.js";
import type { ChaosTaskConfig } from "./support/chaos-tracker.js";
import { testDocker, testEngine } from "./support/docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import type { TaskInfo } from "./support/shim-process.js";

/*
 * The chaos suite: the built shim runs as a child process against the real engine; it is
 * SIGKILLed at every failpoint and at random moments, restarted on the same home, and the oracle
 * (support/chaos-oracle.ts) checks the invariants I1–I8 of docs/fault-matrix.md after every
 * scenario. Each test title starts with the id of the docs/fault-matrix.md row it covers; one
 * summary line is printed at the end.
 *
 * Each scenario has its own home, host user (authorized_keys with hand-written lines), volume
 * mount root and a view of the engine that holds only its own containers
 * (support/chaos-docker-proxy.ts). The host fixture (two AMD-style GPUs, GCP-style loop-device
 * volumes, a fixed boot id) is support/chaos-host.ts.
 *
 * Environment: CHAOS_SOAK_SECONDS (default 30) lengthens the A15 soak; CHAOS_SHIM_BUNDLE runs
 * another bundle than dist/taskshim.cjs (a copy is taken at start either way); CHAOS_VERBOSE=1
 * prints what the shim did where the matrix leaves it a choice (R1, W2, W3, A15).
 */

const SOAK_SECONDS = Number(process.env.CHAOS_SOAK_SECONDS ?? "30");
const MIB = 1024 * 1024;
/**
 * What task.json may say before `running`: the start writes these steps without waiting (a
 * restart resumes them all alike), so a kill can land before the latest one is on disk.
 */
const PRE_CONTAINER = ["pending", "preparing", "pulling", "creating"];

const host = new ChaosHost();
const stats = new ChaosStats();
const scenarios: Scenario[] = [];
const pulled: string[] = [];
let images: TestImages;
let registry: LocalRegistry | undefined;

/** An observation worth a line in a report (printed with CHAOS_VERBOSE=1). */
function note(line: string): void {
  if (process.env.CHAOS_VERBOSE) console.log(line);
}

async function scenario(tag: string): Promise<Scenario> {
  const s = await Scenario.create(host, stats, tag, images.busybox);
  scenarios.push(s);
  return s;
}

/** A fresh single-layer image in the local registry, absent locally (a pull really downloads). */
async function pushedImage(repo: string): Promise<string> {
  registry ??= await startRegistry({ username: "cx", password: "cx-secret-pass" });
  const local = await createUniqueImage();
  const ref = await registry.push(local, repo, "v1");
  await testDocker().getImage(local).remove({ force: true });
  pulled.push(ref);
  return ref;
}

/** The registry images of A6 and R3, made while the host fixture is set up. */
let pullImages: Promise<{ a6: string; r3: string; a16: string }>;

async function inspect(id: string) {
  return testDocker().getContainer(id).inspect();
}

/** The shim's log lines about a task: a failed assertion on its outcome shows how it came about. */
function taskLog(s: Scenario, taskId: string): string {
  return s.api.logs
    .split("\n")
    .filter((line) => line.includes(taskId))
    .join("\n");
}

/** How many times the shim logged a terminal transition of a task (must be exactly one). */
function terminalTransitions(s: Scenario, taskId: string): number {
  const terminal = new Set(["task finished", "task terminated", "task failed to start"]);
  let count = 0;
  for (const line of taskLog(s, taskId).split("\n")) {
    try {
      const entry = JSON.parse(line) as { taskId?: string; msg?: string };
      if (entry.taskId === taskId && terminal.has(entry.msg ?? "")) count += 1;
    } catch {
      // not a log line
    }
  }
  return count;
}

/** Polls Docker until the container no longer runs. */
async function waitContainerExit(id: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!(await inspect(id)).State.Running) return;
    await sleep(25);
  }
  throw new Error(`container ${id} still running after ${timeoutMs} ms`);
}

beforeAll(async () => {
  images = await ensureTestImages();
  pullImages = (async () => ({
    a6: await pushedImage("cx/a6"),
    r3: await pushedImage("cx/r3"),
    a16: await pushedImage("cx/a16"),
  }))();
  pullImages.catch(() => undefined); // awaited (and reported) by the rows that need them
  await host.setup(6);
}, 120_000);

/** Closes every scenario still open (its shims, containers and mounts). */
async function closeScenarios(): Promise<void> {
  for (const s of scenarios.splice(0)) await s.close();
}

afterAll(async () => {
  await closeScenarios();
  await pullImages.catch(() => undefined);
  await registry?.stop();
  for (const ref of pulled)
    await testDocker()
      .getImage(ref)
      .remove({ force: true })
      .catch(() => undefined);
  await host.teardown();
  console.log(stats.summary());
}, 120_000);

// ------------------------------------------------------------------------------------------
describe("chaos: SIGKILL at every failpoint, restart without failpoints (A1–A14, A8b)", () => {
  afterAll(closeScenarios);
  let s: Scenario;
  let bystander: ChaosTaskConfig;
  let bystanderInfo: TaskInfo;
  let bystanderStartedAt: string;
  const bystanderKey = makeHostKey("bystander");

  /** Kills the clean shim and starts one that SIGKILLs itself at `point`. */
  async function armed(point: string): Promise<void> {
    await s.kill();
    await s.start(`${point}=1*kill`);
  }

  /** A row's task: one GPU, its own host key and volume 1 (the bystander has volume 0). */
  function rowTask(row: string, extra: TaskOptions = {}): ChaosTaskConfig {
    return s.task({ gpu: 1, keys: [makeHostKey(row)], volumes: [host.volume(1)], ...extra });
  }

  /** While running, the task holds its GPU, key and volumes, each exactly once. */
  async function expectHeld(t: ChaosTaskConfig, info: TaskInfo): Promise<void> {
    expect(info.gpus_ids).toHaveLength(1);
    expect(info.gpus_ids).not.toContain(bystanderInfo.gpus_ids?.[0]);
    const { marked } = await s.keyEntries();
    for (const key of t.host_ssh_keys ?? []) expect(marked.filter((b) => b === keyBlob(key))).toHaveLength(1);
    const mounts = await s.mounts();
    for (const v of t.volumes ?? []) {
      expect(mounts.filter((m) => m === join(s.mountRoot, String(v.name)))).toHaveLength(1);
    }
  }

  /** The (resumed) task runs normally: one container, adopted or created once, done_by_runner. */
  async function runsToDone(t: ChaosTaskConfig, expectedContainer?: string): Promise<TaskInfo> {
    const running = await s.waitRunning(t.id);
    if (expectedContainer !== undefined) expect(running.container_id).toBe(expectedContainer);
    await expectHeld(t, running);
    await s.go(t.id);
    const done = await s.waitTerminated(t.id);
    expect(done.termination_reason).toBe("done_by_runner");
    const containers = await s.containersOf(t.id);
    expect(containers.map((c) => c.id)).toEqual([running.container_id]);
    expect(containers[0]?.exitCode).toBe(0);
    await s.waitReleased(t.id);
    expect((await s.readState(t.id))?.exit_code).toBe(0);
    return done;
  }

  beforeAll(async () => {
    s = await scenario("fp");
    await s.start();
    bystander = s.task({ gpu: 1, keys: [bystanderKey], volumes: [host.volume(0)] });
    await s.submit(bystander);
    bystanderInfo = await s.waitRunning(bystander.id);
    bystanderStartedAt = (await inspect(bystanderInfo.container_id)).State.StartedAt;
  });

  afterEach(async () => {
    // Rows stay independent: a clean shim again, and no live task but the bystander.
    if (!s.alive()) await s.restart();
    for (const info of await s.list()) {
      if (info.id !== bystander.id && info.status !== "terminated") await s.terminate(info.id);
    }
    s.violations.splice(0); // already counted; a failed row must not fail the next one
  });

  it("A1 kill after the task dir, before task.json: the submit is unanswered, the dir swept, the retry runs once", async () => {
    await armed("after-taskdir");
    const t = rowTask("a1");
    expect(await s.trySubmit(t)).toBeUndefined();
    await s.died();
    expect(existsSync(s.taskDir(t.id))).toBe(true);
    await s.restart();
    expect(await s.get(t.id)).toBeUndefined();
    expect(existsSync(s.taskDir(t.id))).toBe(false);
    await s.submit(t); // the client retries an unanswered submit
    await runsToDone(t);
    await s.oracle();
  });

  it("A1 kill after task.json, before the answer: the task survives and the retried submit is the same task", async () => {
    await armed("after-state:pending");
    const t = rowTask("a1b");
    expect(await s.trySubmit(t)).toBeUndefined();
    await s.died();
    expect((await s.readState(t.id))?.status).toBe("pending");
    await s.restart();
    expect((await s.must(t.id)).status).not.toBe("terminated");
    const again = await s.submit(t);
    expect(again.id).toBe(t.id);
    await runsToDone(t);
    await s.oracle();
  });

  it("A2 kill at after-state:preparing: the start resumes and the task runs to its normal end", async () => {
    await armed("after-state:preparing");
    const t = rowTask("a2");
    await s.submit(t);
    await s.died();
    expect(PRE_CONTAINER).toContain((await s.readState(t.id))?.status);
    expect(await s.containersOf(t.id)).toEqual([]);
    await s.restart();
    expect((await s.must(t.id)).status).not.toBe("terminated");
    await runsToDone(t);
    await s.oracle();
  });

  it("A3 kill after GPU acquire: the GPU is free again, re-acquired once, never double-granted to a newcomer", async () => {
    await armed("after-gpu-acquire");
    const t = rowTask("a3");
    await s.submit(t);
    await s.died();
    await s.restart();
    // A newcomer asks for the same (last free) GPU while the resumed start re-acquires it.
    const rival = s.task({ gpu: 1 });
    await s.submit(rival);
    const settled = async (id: string) =>
      s.waitFor(id, (i) => i.status === "running" || i.status === "terminated");
    const [a, b] = await Promise.all([settled(t.id), settled(rival.id)]);
    const winners = [a, b].filter((i) => i.status === "running");
    const losers = [a, b].filter((i) => i.status === "terminated");
    expect(winners).toHaveLength(1);
    expect(losers.map((l) => [l.termination_reason, l.termination_message])).toEqual([
      ["executor_error", "no capacity: 1 GPUs requested, 0 available"],
    ]);
    const free = FIXTURE_GPUS.filter((g) => !bystanderInfo.gpus_ids?.includes(g));
    expect(winners[0]?.gpus_ids).toEqual(free);
    if (winners[0]?.id === t.id) await runsToDone(t);
    else {
      await s.go(rival.id);
      await s.waitTerminated(rival.id);
    }
    await s.oracle({ probeGpus: true });
  });

  it("A4 kill after the authorized_keys write: the key is written once, kept while the task lives, then removed", async () => {
    await armed("after-keys-write");
    const t = rowTask("a4");
    await s.submit(t);
    await s.died();
    const { marked } = await s.checkKeysFile("A4 while down");
    expect(marked.sort()).toEqual([keyBlob(bystanderKey), keyBlob(t.host_ssh_keys?.[0] ?? "")].sort());
    await s.restart();
    await runsToDone(t);
    expect((await s.keyEntries()).marked).toEqual([keyBlob(bystanderKey)]);
    await s.oracle();
  });

  it("A5 kill after volume 1 of 2 is mounted: no stacked mount, both mounted once while running, both unmounted after", async () => {
    await armed("after-volume-mount:1");
    const t = rowTask("a5", { volumes: [host.volume(1), host.volume(2)] });
    await s.submit(t);
    await s.died();
    expect((await s.mounts()).sort()).toEqual(
      [s.mountPoint(host.volume(0)), s.mountPoint(host.volume(1))].sort(),
    );
    await s.restart();
    await runsToDone(t);
    expect(await s.mounts()).toEqual([s.mountPoint(host.volume(0))]);
    await s.oracle();
  });

  it("A6 kill mid-pull: no container, the pull resumes with the 0600 side-file credentials (then deleted), the task runs", async () => {
    const image = (await pullImages).a6;
    const creds = { username: registry?.username ?? "", password: registry?.password ?? "" };
    await armed("mid-pull");
    const t = rowTask("a6", { image, registry: creds });
    await s.submit(t);
    await s.died();
    expect(await s.containersOf(t.id)).toEqual([]);
    const authFile = join(s.taskDir(t.id), "registry-auth.json");
    expect((await stat(authFile)).mode & 0o777).toBe(0o600);
    expect(await readFile(join(s.taskDir(t.id), "task.json"), "utf8")).not.toContain(creds.password);
    await s.restart();
    await runsToDone(t);
    expect(existsSync(authFile)).toBe(false);
    const pullLog = (await readFile(join(s.taskDir(t.id), "pull.log"), "utf8")).split("\n").filter(Boolean);
    // Podman finishes a pull whose client went away: the resumed start may find the image and
    // pull nothing, leaving an empty pull.log. Docker cancels it, so the resume pulls again.
    if (testEngine() === "docker") expect(pullLog.length).toBeGreaterThan(0);
    for (const line of pullLog) expect(() => JSON.parse(line) as unknown).not.toThrow();
    expect(pullLog.join("\n")).not.toContain(creds.password);
    await s.oracle();
  });

  it("A7 kill after create, before persist (container `created`): adopted and started, never duplicated", async () => {
    await armed("after-create-before-persist");
    const t = rowTask("a7");
    await s.submit(t);
    await s.died();
    const created = await s.containersOf(t.id);
    expect(created.map((c) => c.state)).toEqual(["created"]);
    expect(PRE_CONTAINER).toContain((await s.readState(t.id))?.status);
    await s.restart();
    await runsToDone(t, created[0]?.id);
    await s.oracle();
  });

  it("A8 kill after start, before persist: restored as running from the container, same StartedAt, exit handled", async () => {
    await armed("after-start-before-persist");
    const t = rowTask("a8");
    await s.submit(t);
    await s.died();
    const [c] = await s.containersOf(t.id);
    expect(c?.state).toBe("running");
    expect(PRE_CONTAINER).toContain((await s.readState(t.id))?.status);
    await s.restart();
    const first = await s.must(t.id);
    expect(first.status).toBe("running");
    expect(first.container_id).toBe(c?.id);
    expect((await inspect(c?.id ?? "")).State.StartedAt).toBe(c?.startedAt);
    await runsToDone(t, c?.id);
    await s.oracle();
  });

  it("A8b a `created` container whose task.json already says running: finalized executor_error, never reported running", async () => {
    // No failpoint sits between persisting the container id and starting it, so the kill comes
    // right after create (container `created`) and task.json is then edited to `running`, the
    // state the pre-fix Go shim would restore as running.
    await armed("after-create-before-persist");
    const t = rowTask("a8b");
    await s.submit(t);
    await s.died();
    const [c] = await s.containersOf(t.id);
    expect(c?.state).toBe("created");
    const file = join(s.taskDir(t.id), "task.json");
    const state = JSON.parse(await readFile(file, "utf8")) as Record<string, unknown>;
    await writeFile(file, JSON.stringify({ ...state, status: "running" }));
    await s.restart();
    const first = await s.must(t.id);
    expect([first.status, first.termination_reason, first.termination_message]).toEqual([
      "terminated",
      "executor_error",
      "container was not started",
    ]);
    expect((await inspect(c?.id ?? "")).State.Status).toBe("created");
    await s.waitReleased(t.id);
    await s.oracle();
  });

  it("A8b the `created` container was started by the killed shim's late request and exited: the resumed start never starts it again", async () => {
    // The killed shim's start request can land after the restore listed the container as
    // `created`. A delay in the resumed start's prepare step widens that window to seconds, and
    // a `docker start` from here stands in for the late request.
    await armed("after-create-before-persist");
    const t = rowTask("a8b-late", {
      command: ["sh", "-c", "echo ran >> /tmp/runner/runs; exit 0"],
      fate: { kind: "exits", code: 0, trigger: "self" },
    });
    await s.submit(t);
    await s.died();
    const [c] = await s.containersOf(t.id);
    expect(c?.state).toBe("created");
    await s.start("after-keys-write=1*delay(2000)");
    await s.startContainer(c?.id ?? "");
    await waitContainerExit(c?.id ?? "");
    const startedAt = (await inspect(c?.id ?? "")).State.StartedAt;
    await s.containers(); // the tracker records this StartedAt (I6)
    const done = await s.waitTerminated(t.id);
    await s.containers(); // and sees a second start, if any
    expect([done.termination_reason, done.container_id]).toEqual(["done_by_runner", c?.id]);
    expect((await inspect(c?.id ?? "")).State.StartedAt).toBe(startedAt);
    expect(await readFile(join(s.taskDir(t.id), "runner", "runs"), "utf8")).toBe("ran\n");
    await s.waitReleased(t.id);
    await s.kill();
    await s.restart();
    await s.oracle();
  });

  it("A11 kill after the terminate intent: the restart completes the stop with the requested reason", async () => {
    const t = rowTask("a11");
    await s.submit(t);
    const running = await s.waitRunning(t.id);
    await armed("after-terminate-intent");
    expect(await s.terminate(t.id, "terminated_by_user", "a11 stop")).toBeUndefined();
    await s.died();
    expect((await inspect(running.container_id)).State.Running).toBe(true);
    // The intent is durable beside `running`: the task says terminated only once it has stopped.
    const down = await s.readState(t.id);
    expect([down?.status, down?.termination_reason]).toEqual(["running", "terminated_by_user"]);
    await s.restart();
    const first = await s.must(t.id);
    expect([first.status, first.termination_reason, first.termination_message]).toEqual([
      "terminated",
      "terminated_by_user",
      "a11 stop",
    ]);
    await waitContainerExit(running.container_id);
    await s.waitReleased(t.id);
    expect((await s.readState(t.id))?.exit_code).toBe((await inspect(running.container_id)).State.ExitCode);
    await s.oracle();
  });

  it("A12 kill after the stop, before persist: reason stays terminated_by_user, exit 137 recorded, not blamed on the workload", async () => {
    const t = rowTask("a12");
    await s.submit(t);
    const running = await s.waitRunning(t.id);
    await armed("after-stop-before-persist");
    expect(await s.terminate(t.id, "terminated_by_user", "a12 stop")).toBeUndefined();
    await s.died();
    expect((await inspect(running.container_id)).State.Running).toBe(false);
    await s.restart();
    const first = await s.must(t.id);
    expect([first.status, first.termination_reason, first.termination_message]).toEqual([
      "terminated",
      "terminated_by_user",
      "a12 stop",
    ]);
    await s.waitReleased(t.id);
    expect((await s.readState(t.id))?.exit_code).toBe(137);
    await s.oracle();
  });

  it.each(["volumes", "keys", "gpus"])(
    "A13 kill at mid-release:%s: the release re-runs from cleaned_up=false, each step once, everything freed",
    async (step) => {
      const t = rowTask(`a13-${step}`);
      await s.submit(t);
      await s.waitRunning(t.id);
      await armed(`mid-release:${step}`);
      await s.go(t.id);
      await s.died();
      const down = await s.readState(t.id);
      expect([down?.status, down?.termination_reason, down?.cleaned_up]).toEqual([
        "terminated",
        "done_by_runner",
        false,
      ]);
      expect(await s.mounts()).toEqual([s.mountPoint(host.volume(0))]); // volumes went first
      await s.restart();
      expect((await s.must(t.id)).termination_reason).toBe("done_by_runner");
      await s.waitReleased(t.id);
      expect((await s.keyEntries()).marked).toEqual([keyBlob(bystanderKey)]);
      await s.oracle({ probeGpus: step === "gpus" });
    },
  );

  it("A13 kill at mid-release:keys, then a crash during the recovery: a released host key is never re-added", async () => {
    const t = rowTask("a13-regrant");
    await s.submit(t);
    await s.waitRunning(t.id);
    await armed("mid-release:keys");
    await s.go(t.id);
    await s.died();
    expect((await s.keyEntries()).marked).toEqual([keyBlob(bystanderKey)]); // already removed
    // The recovery's own release (of this very task) is cut too, before it reaches the keys.
    await s.start("mid-release:volumes=1*kill", { waitReady: false });
    await s.died();
    const { marked } = await s.checkKeysFile("A13 after a crash during recovery");
    if (marked.includes(keyBlob(t.host_ssh_keys?.[0] ?? ""))) {
      s.violation("leaked_keys", `${t.id}: its released key was written back during the recovery`);
    }
    await s.restart();
    await s.waitReleased(t.id);
    await s.oracle();
  });

  it("A14 kill after the container remove: still done_by_runner (not exit unknown), the retried remove completes", async () => {
    const t = rowTask("a14");
    await s.submit(t);
    await runsToDone(t);
    await s.kill();
    await s.start("after-container-remove=1*kill");
    expect(await s.remove(t.id)).toBeUndefined();
    await s.died();
    expect(await s.containersOf(t.id)).toEqual([]);
    expect(existsSync(s.taskDir(t.id))).toBe(true);
    await s.restart();
    const first = await s.must(t.id);
    expect([first.status, first.termination_reason]).toEqual(["terminated", "done_by_runner"]);
    expect((await s.remove(t.id))?.status).toBe(200);
    expect(await s.get(t.id)).toBeUndefined();
    expect(existsSync(s.taskDir(t.id))).toBe(false);
    await s.oracle();
  });

  it("A-rows bystander: the same container, StartedAt, GPU, key and volume through every kill above", async () => {
    const now = await s.must(bystander.id);
    expect([now.status, now.container_id, now.gpus_ids]).toEqual([
      "running",
      bystanderInfo.container_id,
      bystanderInfo.gpus_ids,
    ]);
    const info = await inspect(now.container_id);
    expect([info.State.StartedAt, info.RestartCount]).toEqual([bystanderStartedAt, 0]);
    await s.oracle({ probeGpus: true });
    await s.go(bystander.id);
    expect((await s.waitTerminated(bystander.id)).termination_reason).toBe("done_by_runner");
    await s.oracle({ probeGpus: true });
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: running tasks across kills and stops (A9, A10, A16, U6)", () => {
  afterEach(closeScenarios);
  /** The highest `tick N` a default workload has logged so far. */
  async function lastTick(containerId: string): Promise<number> {
    const logs = await testDocker().getContainer(containerId).logs({ stdout: true, stderr: true, tail: 20 });
    const ticks = [...logs.toString("latin1").matchAll(/tick (\d+)/g)].map((m) => Number(m[1]));
    return Math.max(0, ...ticks);
  }

  it("A9 ten kills while a task runs: same container and StartedAt, running every time, nothing re-acquired", async () => {
    const s = await scenario("a9");
    await s.start();
    const t = s.task({ gpu: 1, keys: [makeHostKey("a9")], volumes: [host.volume(2)] });
    await s.submit(t);
    const first = await s.waitRunning(t.id);
    const startedAt = (await inspect(first.container_id)).State.StartedAt;
    const keysBefore = (await s.keyEntries()).raw;
    const mountsBefore = await s.mounts();
    const tickBefore = await lastTick(first.container_id);
    for (let i = 0; i < 10; i++) {
      await s.kill();
      await s.restart();
      const now = await s.must(t.id); // the very first answer after the restart
      expect([now.status, now.container_id, now.gpus_ids]).toEqual([
        "running",
        first.container_id,
        first.gpus_ids,
      ]);
      const info = await inspect(first.container_id);
      expect([info.State.Running, info.State.StartedAt, info.RestartCount]).toEqual([true, startedAt, 0]);
      expect((await s.keyEntries()).raw.equals(keysBefore)).toBe(true);
      expect(await s.mounts()).toEqual(mountsBefore);
    }
    expect(await lastTick(first.container_id)).toBeGreaterThan(tickBefore); // logs kept flowing
    await s.oracle({ probeGpus: true });
    await s.go(t.id);
    expect((await s.waitTerminated(t.id)).termination_reason).toBe("done_by_runner");
    await s.oracle({ probeGpus: true });
  }, 240_000);

  it("A10 exits while the shim is down (0, 3, OOM): final before the first answer, real exit codes and last lines, released once", async () => {
    const s = await scenario("a10");
    await s.start();
    const ok = s.task({ exit: 0, gpu: 1, keys: [makeHostKey("a10-ok")], volumes: [host.volume(3)] });
    const failed = s.task({ exit: 3, gpu: 1, keys: [makeHostKey("a10-failed")] });
    const oom = s.task({
      keys: [makeHostKey("a10-oom")],
      memory: 8 * MIB,
      command: waitCommand(0, "echo eating; x=$(yes | head -c 67108864); echo survived; "),
      fate: { kind: "exits", code: 137, trigger: "go", oom: true },
    });
    // Podman 4.3.1 here (conmon 2.1.6, cgroup v1 hybrid) records no OOM kill: OOMKilled stays
    // false and the exit is a plain 137, so the OOM case runs on Docker only (TESTING.md).
    const withOom = testEngine() === "docker";
    const tasks = withOom ? [ok, failed, oom] : [ok, failed];
    const running: TaskInfo[] = [];
    for (const t of tasks) await s.submit(t);
    for (const t of tasks) running.push(await s.waitRunning(t.id));
    await s.kill();
    for (const t of tasks) await s.go(t.id);
    for (const r of running) await waitContainerExit(r.container_id);
    if (withOom) {
      const oomState = (await inspect(running[2]?.container_id ?? "")).State;
      // The OOM really happens on this engine (cgroup memory limit, no swap); fail loudly if not.
      expect([oomState.OOMKilled, oomState.ExitCode]).toEqual([true, 137]);
    }

    await s.restart();
    const [a, b] = [await s.must(ok.id), await s.must(failed.id)];
    expect([a.status, a.termination_reason, a.termination_message]).toEqual([
      "terminated",
      "done_by_runner",
      "",
    ]);
    expect([b.status, b.termination_reason, b.termination_message]).toEqual([
      "terminated",
      "container_exited_with_error",
      WAIT_TASK_TAIL,
    ]);
    if (withOom) {
      const c = await s.must(oom.id);
      expect([c.status, c.termination_reason]).toEqual(["terminated", "container_exited_with_error"]);
      expect(c.termination_message.split("\n")[0]).toBe("container was OOM-killed");
      expect(c.termination_message).toContain("eating");
      expect(c.termination_message).not.toContain("survived");
    }
    const codes = [[ok, 0] as const, [failed, 3] as const, ...(withOom ? [[oom, 137] as const] : [])];
    for (const [t, code] of codes) {
      await s.waitReleased(t.id);
      expect((await s.readState(t.id))?.exit_code).toBe(code);
    }
    expect((await s.keyEntries()).marked).toEqual([]);
    expect(await s.mounts()).toEqual([]);
    await s.oracle({ probeGpus: true });
  });

  it("A16 graceful SIGTERM while running and mid-pull: exit 0, nothing stopped or released, the pull resumes after the restart", async () => {
    const s = await scenario("a16");
    const creds = { username: registry?.username ?? "", password: registry?.password ?? "" };
    const image = (await pullImages).a16;
    await s.start("mid-pull=1*delay(3000)");
    const running = s.task({ gpu: 1, keys: [makeHostKey("a16-running")], volumes: [host.volume(0)] });
    await s.submit(running);
    const before = await s.waitRunning(running.id);
    const pulling = s.task({ image, registry: creds, keys: [makeHostKey("a16-pulling")] });
    await s.submit(pulling);
    await s.waitFor(pulling.id, (i) => i.status === "pulling");
    await sleep(300); // inside the delayed pull
    const keys = (await s.keyEntries()).raw;
    const startedAt = (await inspect(before.container_id)).State.StartedAt;
    expect(await s.api.stop()).toBe(0); // SIGTERM
    const info = await inspect(before.container_id);
    expect([info.State.Running, info.State.StartedAt]).toEqual([true, startedAt]);
    expect((await s.keyEntries()).raw.equals(keys)).toBe(true);
    expect(await s.mounts()).toEqual([s.mountPoint(host.volume(0))]);
    expect((await s.readState(pulling.id))?.status).toBe("pulling");
    await s.restart();
    expect(await s.must(running.id)).toMatchObject({
      status: "running",
      container_id: before.container_id,
      gpus_ids: before.gpus_ids,
    });
    await s.waitRunning(pulling.id);
    for (const t of [running, pulling]) await s.go(t.id);
    for (const t of [running, pulling])
      expect((await s.waitTerminated(t.id)).termination_reason).toBe("done_by_runner");
    await s.oracle({ probeGpus: true });
  });

  it("U6 crash loop: 20 kills right after startup's reconcile tick leave no duplicate keys, stacked mounts or temp files", async () => {
    const s = await scenario("u6");
    await s.start();
    const shared = makeHostKey("u6-shared");
    const long = s.task({ gpu: 1, keys: [shared], volumes: [host.volume(4)] });
    const midway = s.task({ keys: [shared, makeHostKey("u6-midway")], volumes: [host.volume(5)] });
    const finished = s.task({ keys: [makeHostKey("u6-finished")] });
    for (const t of [long, midway, finished]) await s.submit(t);
    for (const t of [long, midway, finished]) await s.waitRunning(t.id);
    await s.go(finished.id);
    await s.waitTerminated(finished.id);
    await s.waitReleased(finished.id);
    const runnersBefore = (await readdir(join(s.home, "runners"))).sort();
    let maxTemp = 0;
    for (let i = 0; i < 20; i++) {
      await s.kill();
      const { marked } = await s.checkKeysFile(`U6 kill #${i + 1}`);
      expect(new Set(marked).size).toBe(marked.length);
      const mounts = await s.mounts();
      expect(new Set(mounts).size).toBe(mounts.length);
      maxTemp = Math.max(maxTemp, (await s.tempFiles()).length);
      await s.restart();
      // A release happens inside the loop too: `midway` exits while the shim cycles.
      if (i === 8) await s.go(midway.id);
      await sleep(Math.random() * 150);
    }
    expect(maxTemp).toBeLessThanOrEqual(1);
    expect(await s.tempFiles()).toEqual([]);
    expect((await readdir(join(s.home, "runners"))).sort()).toEqual(runnersBefore);
    expect((await s.must(midway.id)).termination_reason).toBe("done_by_runner");
    expect((await s.keyEntries()).marked).toEqual([keyBlob(shared)]);
    expect(await s.mounts()).toEqual([s.mountPoint(host.volume(4))]);
    await s.oracle({ probeGpus: true });
    await s.go(long.id);
    await s.waitTerminated(long.id);
    await s.oracle();
  }, 240_000);
});

// ------------------------------------------------------------------------------------------
describe("chaos: corrupt, cut and stale state files (S1–S3)", () => {
  afterAll(closeScenarios);
  let s: Scenario;
  let empty: ChaosTaskConfig;
  let cut: ChaosTaskConfig;
  let misshapen: ChaosTaskConfig;
  let healthy: ChaosTaskConfig;
  let stale: ChaosTaskConfig;
  const running = new Map<string, TaskInfo>();
  const startedAt = new Map<string, string>();
  const degradedKey = makeHostKey("s1-degraded");
  const healthyKey = makeHostKey("s1-healthy");

  beforeAll(async () => {
    s = await scenario("s1");
    await s.start();
    empty = s.task({ keys: [degradedKey] });
    cut = s.task({ gpu: 1 });
    misshapen = s.task({});
    healthy = s.task({ keys: [healthyKey] });
    stale = s.task({ exit: 3 });
    for (const t of [empty, cut, misshapen, healthy, stale]) await s.submit(t);
    for (const t of [empty, cut, misshapen, healthy, stale]) {
      const info = await s.waitRunning(t.id);
      running.set(t.id, info);
      startedAt.set(t.id, (await inspect(info.container_id)).State.StartedAt);
    }
    await s.kill();
    const stateOf = (t: ChaosTaskConfig) => join(s.taskDir(t.id), "task.json");
    await truncate(stateOf(empty), 0);
    const text = await readFile(stateOf(cut), "utf8");
    await writeFile(stateOf(cut), text.slice(0, Math.floor(text.length / 2)));
    // S2 stand-in: valid JSON that is not a task state (a hand edit); there is no checksum.
    await writeFile(
      stateOf(misshapen),
      JSON.stringify({ version: 1, id: misshapen.id, config: { id: "other" } }),
    );
    // S3: temp files of writes cut by a kill, one of them a plausible newer state.
    const dir = s.taskDir(stale.id);
    await writeFile(join(dir, ".task.json.tmp-99999-1"), '{"version":1,"id":');
    const newer = JSON.parse(await readFile(join(dir, "task.json"), "utf8")) as Record<string, unknown>;
    await writeFile(
      join(dir, ".task.json.tmp-99999-2"),
      JSON.stringify({ ...newer, status: "terminated", termination_reason: "terminated_by_user" }),
    );
    for (const t of [empty, cut, misshapen]) s.entry(t.id).degraded = true;
    await s.restart(); // I7: the shim always starts
  });

  it("S1 task.json truncated to 0 bytes, cut mid-object, or not a task state: quarantined, the shim starts, containers untouched", async () => {
    for (const t of [empty, cut, misshapen]) {
      // Moved out of the task dir with a note of why, so a later remove of the task keeps it.
      const dir = s.taskDir(t.id);
      const quarantine = await readdir(join(dirname(dirname(dir)), "quarantine"));
      const mine = quarantine.filter((f) => f.startsWith(`${basename(dir)}.`));
      expect(mine.map((f) => f.replace(/^.*\.\d+\./, "")).sort()).toEqual(["note.json", "task.json"]);
      expect(await readdir(dir)).not.toContain("task.json");
      const now = await s.must(t.id);
      expect([now.status, now.container_id]).toEqual(["running", running.get(t.id)?.container_id]);
      const info = await inspect(now.container_id);
      expect([info.State.Running, info.State.StartedAt]).toEqual([true, startedAt.get(t.id)]);
    }
    expect(s.api.logs.match(/corrupt task state quarantined/g)).toHaveLength(3);
    // The GPU of the degraded task is re-locked from its container's devices.
    expect((await s.must(cut.id)).gpus_ids).toEqual(running.get(cut.id)?.gpus_ids);
    // Its config is unknown, so its host key must not be removed while it lives (fault matrix S1): the
    // oracle expects the keys of every live task, the degraded ones included.
    await s.oracle({ probeGpus: true });
  });

  // S2 (bad checksum, valid JSON) does not apply: task.json v1 carries no checksum. S1 covers the
  // nearest case, valid JSON that is not a task state, which is quarantined.

  it("S3 stale .task.json.tmp-* files are swept at start and never loaded", async () => {
    expect((await readdir(s.taskDir(stale.id))).filter((f) => f.includes(".tmp-"))).toEqual([]);
    const now = await s.must(stale.id);
    expect([now.status, now.container_id]).toEqual(["running", running.get(stale.id)?.container_id]);
    expect((await s.readState(stale.id))?.termination_reason).toBe("");
  });

  it("S1/S3 aftermath: degraded tasks terminate and remove cleanly; oracle", async () => {
    for (const t of [empty, cut, misshapen]) {
      expect((await s.terminate(t.id))?.status).toBe(200);
      expect((await s.remove(t.id))?.status).toBe(200);
      expect(existsSync(s.taskDir(t.id))).toBe(false);
    }
    for (const t of [healthy, stale]) await s.go(t.id);
    await s.waitTerminated(healthy.id);
    expect((await s.waitTerminated(stale.id)).termination_message).toBe(WAIT_TASK_TAIL);
    await s.oracle({ probeGpus: true });
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: a kill in the middle of an authorized_keys update (S8)", () => {
  afterAll(closeScenarios);

  it("S8 kills in the middle of authorized_keys updates: the file is old or new, never empty, hand lines byte-identical", async () => {
    const k = await scenario("s8");
    await k.start();
    const shared = makeHostKey("s8-shared");
    // Tasks whose pull fails at once: each writes the keys twice (prepare, release) and needs
    // no container, so the shim rewrites authorized_keys many times a second.
    const unpullable = "127.0.0.1:1/cx/none:v1";
    const versions = new Set<string>();
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const raw = await readFile(k.keysFile).catch(() => undefined);
        if (raw !== undefined) {
          versions.add(raw.toString("latin1"));
          if (raw.length === 0) k.violation("leaked_keys", "S8: authorized_keys seen empty");
        }
        await sleep(1);
      }
    })();
    for (let round = 0; round < 4; round++) {
      const batch = Array.from({ length: 6 }, (_, i) =>
        k.task({
          image: i === 0 ? images.busybox : unpullable,
          command: ["sh", "-c", "sleep 0.3"],
          fate: { kind: "exits", code: 0, trigger: "self" },
          keys: [shared, makeHostKey(`s8-${round}-${i}`)],
        }),
      );
      const submits = batch.map((t) => k.trySubmit(t));
      await sleep(50 + Math.random() * 400);
      await k.kill();
      await Promise.all(submits);
      const { marked } = await k.checkKeysFile(`S8 kill #${round + 1}`);
      const known = new Set(
        [...k.tracked.values()].flatMap((t) => (t.config.host_ssh_keys ?? []).map(keyBlob)),
      );
      for (const blob of marked) expect(known.has(blob)).toBe(true);
      await k.restart();
    }
    watching = false;
    await watcher;
    expect(versions.size).toBeGreaterThan(3); // the kills did land among real updates
    for (const t of k.tracked.values()) {
      if (t.answered) await k.waitTerminated(t.config.id);
    }
    await k.oracle();
    expect((await k.keyEntries()).marked).toEqual([]);
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: concurrency races (R1, R2, R3, R6, R7)", () => {
  afterAll(closeScenarios);
  let s: Scenario;

  beforeAll(async () => {
    s = await scenario("r");
    await s.start();
  });

  it("R1 terminate and a natural exit at the same instant: one terminal transition, a coherent reason, released once", async () => {
    // From "the same instant" to "clearly after the exit": both orders must be coherent.
    const offsets = [0, 10, 30, 100, 300, 1000];
    const tasks = offsets.map((_, i) =>
      s.task({ exit: i % 2 === 0 ? 0 : 3, keys: [makeHostKey(`r1-${i}`)] }),
    );
    for (const t of tasks) await s.submit(t);
    for (const t of tasks) await s.waitRunning(t.id);
    const answers = await Promise.all(
      tasks.map(async (t, i) => {
        await s.go(t.id); // the workload sees it within 50 ms and exits
        await sleep(offsets[i] ?? 0);
        return s.terminate(t.id, "terminated_by_user", "r1 stop");
      }),
    );
    const outcomes: string[] = [];
    for (const [i, t] of tasks.entries()) {
      expect(answers[i]?.status).toBe(200);
      const code = i % 2 === 0 ? 0 : 3;
      const natural = code === 0 ? "done_by_runner" : "container_exited_with_error";
      const done = await s.waitTerminated(t.id);
      expect(answers[i]?.json.termination_reason).toBe(done.termination_reason);
      expect(["terminated_by_user", natural]).toContain(done.termination_reason);
      await s.waitReleased(t.id);
      const exitCode = (await s.readState(t.id))?.exit_code;
      if (done.termination_reason === natural) expect(exitCode, taskLog(s, t.id)).toBe(code);
      else expect([code, 137], taskLog(s, t.id)).toContain(exitCode);
      outcomes.push(`${done.termination_reason}/${exitCode}`);
      expect(terminalTransitions(s, t.id)).toBe(1);
    }
    note(`R1 outcomes (offsets ${offsets.join(",")} ms): ${outcomes.join(" ")}`);
    expect((await s.keyEntries()).marked).toEqual([]);
    await s.oracle();
  });

  it("R2 two concurrent terminates and a retry: all answered 200 with the first reason, one stop, one release", async () => {
    const t = s.task({ gpu: 1, keys: [makeHostKey("r2")], volumes: [host.volume(0)] });
    await s.submit(t);
    const running = await s.waitRunning(t.id);
    const [a, b] = await Promise.all([
      s.terminate(t.id, "terminated_by_user", "r2 first"),
      s.terminate(t.id, "terminated_by_server", "r2 second"),
    ]);
    const retry = await s.terminate(t.id, "aborted_by_user", "r2 retry");
    expect([a?.status, b?.status, retry?.status]).toEqual([200, 200, 200]);
    const reasons = [a, b, retry].map((x) => `${x?.json.termination_reason}|${x?.json.termination_message}`);
    expect(new Set(reasons).size).toBe(1);
    expect(["terminated_by_user|r2 first", "terminated_by_server|r2 second"]).toContain(reasons[0]);
    await s.waitReleased(t.id);
    expect((await inspect(running.container_id)).State.Running).toBe(false);
    expect((await s.readState(t.id))?.exit_code).toBe(137);
    await s.oracle({ probeGpus: true });
  });

  it("R6 two tasks share one host key: when one finishes the key stays (once), when both finish it goes", async () => {
    const sharedKey = makeHostKey("r6-shared");
    const ownKey = makeHostKey("r6-own");
    const first = s.task({ keys: [sharedKey, ownKey] });
    const second = s.task({ keys: [sharedKey] });
    await s.submit(first);
    await s.submit(second);
    await s.waitRunning(first.id);
    await s.waitRunning(second.id);
    expect((await s.keyEntries()).marked.sort()).toEqual([keyBlob(sharedKey), keyBlob(ownKey)].sort());
    await s.go(first.id);
    await s.waitTerminated(first.id);
    await s.waitReleased(first.id);
    expect((await s.keyEntries()).marked).toEqual([keyBlob(sharedKey)]);
    await s.oracle();
    await s.go(second.id);
    await s.waitTerminated(second.id);
    await s.waitReleased(second.id);
    expect((await s.keyEntries()).marked).toEqual([]);
    await s.oracle();
  });

  it("R3 terminate during a slow pull: the pull is aborted, no container is ever created, the requested reason stands", async () => {
    const image = (await pullImages).r3;
    const creds = { username: registry?.username ?? "", password: registry?.password ?? "" };
    await s.kill();
    await s.start("mid-pull=1*delay(3000)");
    const t = s.task({
      image,
      registry: creds,
      gpu: 1,
      keys: [makeHostKey("r3")],
      volumes: [host.volume(1)],
    });
    await s.submit(t);
    await s.waitFor(t.id, (i) => i.status === "pulling");
    await sleep(300); // inside the delayed pull
    const answer = await s.terminate(t.id, "terminated_by_user", "r3 stop");
    expect([answer?.status, answer?.json.termination_reason]).toEqual([200, "terminated_by_user"]);
    // Watch past the end of the delay (3 s from the pull request): a late create would land here.
    const until = Date.now() + 3_500;
    while (Date.now() < until) {
      expect(await s.containersOf(t.id)).toEqual([]);
      await sleep(100);
    }
    await s.waitReleased(t.id);
    expect(existsSync(join(s.taskDir(t.id), "registry-auth.json"))).toBe(false);
    await s.kill();
    await s.restart();
    const after = await s.must(t.id);
    expect([after.status, after.termination_reason, after.termination_message]).toEqual([
      "terminated",
      "terminated_by_user",
      "r3 stop",
    ]);
    expect(await s.containersOf(t.id)).toEqual([]);
    await s.oracle({ probeGpus: true });
  });

  it("R7 remove during an in-progress release: remove waits for it, no error surfaced, everything released and the dir removed once", async () => {
    await s.kill();
    await s.start("mid-release:volumes=1*delay(1500)");
    const t = s.task({ gpu: 1, keys: [makeHostKey("r7")], volumes: [host.volume(2)] });
    await s.submit(t);
    await s.waitRunning(t.id);
    await s.go(t.id);
    await s.waitTerminated(t.id); // the reconciler's release starts right after this commit
    const before = Date.now();
    const removed = await s.remove(t.id);
    const waited = Date.now() - before;
    expect(removed?.status).toBe(200);
    expect(waited).toBeGreaterThan(500); // it did overlap the release
    expect(await s.get(t.id)).toBeUndefined();
    expect(existsSync(s.taskDir(t.id))).toBe(false);
    expect(await s.mounts()).toEqual([]);
    expect((await s.keyEntries()).marked).toEqual([]);
    expect(s.api.logs).not.toMatch(/released with errors|release after failed start failed/);
    await s.oracle({ probeGpus: true });
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: containers changed while the shim is down (W1–W4)", () => {
  afterAll(closeScenarios);
  let s: Scenario;
  let removed: ChaosTaskConfig;
  let restarted: ChaosTaskConfig;
  let neverCreated: ChaosTaskConfig;
  let removedInfo: TaskInfo;
  let restartedInfo: TaskInfo;
  let restartedBefore: string;
  const strays: { name: string; id: string; startedAt: string; taskId: string }[] = [];

  async function createStray(suffix: string, taskId: string): Promise<void> {
    const name = `${s.prefix}${suffix}`;
    const labels: Record<string, string> = { [LABEL_IS_TASK]: "true", "taskshim.chaos": "1" };
    if (taskId !== "") labels[LABEL_TASK_ID] = taskId;
    const container = await testDocker().createContainer({
      name,
      Image: images.busybox,
      Cmd: ["sleep", "300"],
      Labels: labels,
      HostConfig: { RestartPolicy: { Name: "no" } },
    });
    await container.start();
    s.strays.add(name);
    strays.push({ name, id: container.id, startedAt: (await container.inspect()).State.StartedAt, taskId });
  }

  beforeAll(async () => {
    s = await scenario("w");
    await s.start();
    removed = s.task({ gpu: 1, keys: [makeHostKey("w1")], volumes: [host.volume(3)] });
    restarted = s.task({ keys: [makeHostKey("w2")] });
    await s.submit(removed);
    await s.submit(restarted);
    removedInfo = await s.waitRunning(removed.id);
    restartedInfo = await s.waitRunning(restarted.id);
    // `running` is served a moment before it is durable; this row is about the removal, so
    // kill only once it is (the window itself is the next W1 test).
    await s.waitPersisted(removed.id, "running");
    await s.kill();
    await s.start("after-state:creating=1*kill");
    neverCreated = s.task({ keys: [makeHostKey("w4")] });
    await s.submit(neverCreated);
    await s.died();

    // While the shim is down:
    await s.removeContainer(removedInfo.container_id); // W1
    restartedBefore = (await inspect(restartedInfo.container_id)).State.StartedAt;
    await s.restartContainer(restartedInfo.container_id); // W2
    await createStray("stray-labelled", `${s.prefix}stray-task`); // W3, with a task id label
    await createStray("stray-unlabelled", ""); // W3, without one
    expect(await s.containersOf(neverCreated.id)).toEqual([]); // W4
    expect(PRE_CONTAINER).toContain((await s.readState(neverCreated.id))?.status);
    await s.restart();
  });

  afterAll(async () => {
    for (const stray of strays) {
      await testDocker()
        .getContainer(stray.id)
        .remove({ force: true })
        .catch(() => undefined);
    }
  });

  it("W1 container removed while down: terminated executor_error 'container not found', exit unknown (never 0), released", async () => {
    const first = await s.must(removed.id);
    expect([first.status, first.termination_reason, first.termination_message]).toEqual([
      "terminated",
      "executor_error",
      "container not found",
    ]);
    await s.waitReleased(removed.id);
    expect((await s.readState(removed.id))?.exit_code).toBeNull();
    expect(await s.mounts()).toEqual([]);
  });

  it("W2 container restarted by someone while down: still the same task and container, RestartPolicy no, exit handled", async () => {
    const now = await s.must(restarted.id);
    expect([now.status, now.container_id]).toEqual(["running", restartedInfo.container_id]);
    const info = await inspect(now.container_id);
    expect(info.HostConfig.RestartPolicy?.Name).toBe("no");
    expect(info.State.StartedAt).not.toBe(restartedBefore);
    const surfaced = /restart|StartedAt/i.test(
      s.api.logs
        .split("\n")
        .filter((l) => l.includes(restarted.id))
        .join("\n"),
    );
    note(
      `W2: docker restart while down ${surfaced ? "is" : "is NOT"} surfaced in the shim log; the task stays running`,
    );
    await s.go(restarted.id);
    expect((await s.waitTerminated(restarted.id)).termination_reason).toBe("done_by_runner");
  });

  it("W3 stray labelled containers without a task record: left running and untouched by the restore and the first ticks", async () => {
    await sleep(1_200); // at least one reconcile tick after the startup one
    for (const stray of strays) {
      const info = await inspect(stray.id);
      expect([info.State.Running, info.State.StartedAt]).toEqual([true, stray.startedAt]);
    }
    // The one ownership rule: no owner label and no task.json in this home → foreign, never a task.
    expect(await s.get(`${s.prefix}stray-task`)).toBeUndefined();
    note("W3: the stray with a task id label is foreign (not adopted, not listed); neither stray is removed");
  });

  it("W4 task record and dir but no container: the start resumes, one container, normal end", async () => {
    const running = await s.waitRunning(neverCreated.id);
    expect((await s.containersOf(neverCreated.id)).map((c) => c.id)).toEqual([running.container_id]);
    await s.go(neverCreated.id);
    expect((await s.waitTerminated(neverCreated.id)).termination_reason).toBe("done_by_runner");
  });

  it("W1 after an A8 kill (task.json not yet running, the container ran): a container removed while down is never re-created", async () => {
    await s.kill();
    await s.start("after-start-before-persist=1*kill");
    const t = s.task({ keys: [makeHostKey("w1-a8")] });
    await s.submit(t);
    await s.died();
    const [c] = await s.containersOf(t.id);
    expect(c?.state).toBe("running");
    expect(PRE_CONTAINER).toContain((await s.readState(t.id))?.status);
    await s.restart();
    expect((await s.must(t.id)).status).toBe("running"); // adopted from the container (A8)
    await s.kill();
    await s.removeContainer(c?.id ?? "");
    await s.restart();
    const first = await s.must(t.id);
    expect([first.status, first.termination_reason, first.termination_message]).toEqual([
      "terminated",
      "executor_error",
      "container not found",
    ]);
    await sleep(300); // a resumed start would be creating a second container by now
    expect(await s.containersOf(t.id)).toEqual([]);
  });

  it("W1–W4 oracle: nothing lost, invented, leaked or restarted by the shim", async () => {
    for (const stray of strays)
      await testDocker()
        .getContainer(stray.id)
        .remove({ force: true })
        .catch(() => undefined);
    await s.oracle({ probeGpus: true });
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: the host reboots while the shim is down (D7)", () => {
  afterAll(closeScenarios);

  it("D7 reboot: running tasks end with exit 137 and a message that says so, finished ones keep theirs, a cut start runs in the new boot, all released once", async () => {
    const s = await scenario("d7");
    await s.start();
    const running = s.task({ gpu: 1, keys: [makeHostKey("d7-running")], volumes: [host.volume(4)] });
    const waiting = s.task({ exit: 0, keys: [makeHostKey("d7-waiting")] });
    const finished = s.task({ exit: 3, gpu: 1, keys: [makeHostKey("d7-finished")] });
    for (const t of [running, waiting, finished]) await s.submit(t);
    for (const t of [running, waiting, finished]) await s.waitRunning(t.id);
    await s.go(finished.id);
    const before = await s.waitTerminated(finished.id);
    await s.waitReleased(finished.id);
    for (const t of [running, waiting]) await s.waitPersisted(t.id, "running");
    await s.kill();
    // A start cut before its container: it resumes after the reboot, in the new boot.
    await s.start("after-state:creating=1*kill");
    const resumed = s.task({ exit: 3, keys: [makeHostKey("d7-resumed")] });
    await s.submit(resumed);
    await s.died();
    expect(await s.containersOf(resumed.id)).toEqual([]);

    await s.reboot();
    expect(await s.mounts()).toEqual([]);
    await s.restart();

    for (const t of [running, waiting]) {
      const info = await s.must(t.id);
      expect([info.status, info.termination_reason]).toEqual(["terminated", "container_exited_with_error"]);
      expect(info.termination_message.split("\n")[0]).toBe(
        "the host rebooted while the task was running (exit code 137)",
      );
      await s.waitReleased(t.id);
      expect((await s.readState(t.id))?.exit_code).toBe(137);
    }
    const after = await s.must(finished.id);
    expect([after.termination_reason, after.termination_message]).toEqual([
      before.termination_reason,
      before.termination_message,
    ]);
    expect((await s.readState(finished.id))?.exit_code).toBe(3);

    await s.waitRunning(resumed.id);
    await s.go(resumed.id);
    const ended = await s.waitTerminated(resumed.id);
    // It ran in this boot: its exit is its own, not the reboot's.
    expect([ended.termination_reason, ended.termination_message]).toEqual([
      "container_exited_with_error",
      WAIT_TASK_TAIL,
    ]);
    await s.waitReleased(resumed.id);
    expect((await s.keyEntries()).marked).toEqual([]);
    expect(await s.mounts()).toEqual([]);
    await s.oracle({ probeGpus: true });
  });
});

// ------------------------------------------------------------------------------------------
describe("chaos: random-kill soak (A15)", () => {
  afterEach(closeScenarios);
  it(
    `A15 random SIGKILLs every 0.5–3 s for ${SOAK_SECONDS} s over short and long tasks: oracle holds, statuses never go back`,
    async () => {
      const s = await scenario("soak");
      await s.start();
      const keyPool = [makeHostKey("soak-a"), makeHostKey("soak-b"), makeHostKey("soak-c")];
      const volume = host.volume(5);
      const random = (lo: number, hi: number): number => lo + Math.random() * (hi - lo);
      const pick = <T>(items: readonly T[]): T | undefined => items[Math.floor(Math.random() * items.length)];
      const longTasks = new Set<string>();
      let volumeHolder: string | undefined;
      let ready = true;
      let stop = false;

      const liveIds = (): string[] =>
        [...s.tracked.values()]
          .filter((t) => t.answered && t.removed === "no" && t.terminal === undefined)
          .map((t) => t.config.id);

      async function volumeFree(): Promise<boolean> {
        if (volumeHolder === undefined) return true;
        const t = s.entry(volumeHolder);
        const released = (await s.readState(volumeHolder))?.cleaned_up === true;
        // A holder whose submit was never answered nor persisted never mounted anything.
        const neverCreated = !t.answered && (await s.get(volumeHolder)) === undefined;
        if (t.removed === "yes" || released || neverCreated) {
          volumeHolder = undefined;
          return true;
        }
        return false;
      }

      async function step(): Promise<void> {
        const r = Math.random();
        const live = liveIds();
        const keys = keyPool.filter(() => Math.random() < 0.4);
        const gpu = Math.random() < 0.25 ? 1 : undefined;
        if (r < 0.35 && live.length < 8) {
          const exit = pick([0, 0, 1, 3]) ?? 0;
          const pause = pick(["0", "0.2", "0.5", "1", "2"]) ?? "0";
          const t = s.task({
            command: ["sh", "-c", `echo short; sleep ${pause}; exit ${exit}`],
            fate: { kind: "exits", code: exit, trigger: "self" },
            keys,
            ...(gpu ? { gpu } : {}),
          });
          await s.trySubmit(t);
        } else if (r < 0.5 && live.length < 8) {
          const withVolume = await volumeFree();
          const t = s.task({
            exit: pick([0, 3]) ?? 0,
            keys,
            ...(gpu ? { gpu } : {}),
            ...(withVolume ? { volumes: [volume] } : {}),
          });
          if (withVolume) volumeHolder = t.id;
          longTasks.add(t.id);
          await s.trySubmit(t);
        } else if (r < 0.65) {
          const id = pick([...longTasks].filter((x) => live.includes(x)));
          if (id !== undefined) await s.go(id).catch(() => undefined);
        } else if (r < 0.73) {
          const id = pick(live);
          if (id !== undefined) await s.terminate(id, "terminated_by_user", "soak");
        } else if (r < 0.83) {
          const done = [...s.tracked.values()].filter((t) => t.terminal !== undefined && t.removed === "no");
          const id = pick(done)?.config.id;
          if (id !== undefined) await s.remove(id);
        } else {
          await s.list();
        }
      }

      const driver = (async () => {
        while (!stop) {
          if (ready) await step().catch(() => undefined);
          await sleep(random(30, 150));
        }
      })();
      const deadline = Date.now() + SOAK_SECONDS * 1000;
      let cycles = 0;
      try {
        while (Date.now() < deadline) {
          await sleep(random(500, 3000));
          ready = false;
          await s.kill();
          await s.restart();
          await s.containers(); // I6 on every container after every restart
          ready = true;
          cycles += 1;
        }
      } finally {
        stop = true;
        await driver;
      }

      // Wind down: retry uncertain removes (as a client would), let every long task end, then the oracle.
      for (const t of s.tracked.values()) {
        if (t.removed === "maybe") {
          if ((await s.get(t.config.id)) === undefined) t.removed = "yes";
          else expect((await s.remove(t.config.id))?.status).toBe(200);
        }
      }
      for (const id of longTasks) await s.go(id).catch(() => undefined);
      for (const t of s.tracked.values()) {
        if (t.answered && t.removed === "no") await s.waitTerminated(t.config.id, 30_000);
      }
      note(`A15: ${cycles} kills, ${s.tracked.size} tasks over ${SOAK_SECONDS} s`);
      await s.oracle({ probeGpus: true, settleMs: 20_000 });
      expect(cycles).toBeGreaterThanOrEqual(Math.max(3, Math.floor(SOAK_SECONDS / 10)));
    },
    120_000 + SOAK_SECONDS * 2_000,
  );
});

// ------------------------------------------------------------------------------------------
it("summary: nothing lost, wrong, leaked or restarted across the whole suite", () => {
  expect(stats.counts).toEqual({
    lost: 0,
    wrong_exit: 0,
    leaked_gpus: 0,
    leaked_keys: 0,
    leaked_mounts: 0,
    leaked_dirs: 0,
    leaked_containers: 0,
    restarted_containers: 0,
    other: 0,
  });
});
