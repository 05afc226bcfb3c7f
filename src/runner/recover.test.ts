import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { recover } from "./recover.js";

let env: TestEnv;
let next: TestEnv | undefined;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  await next?.dispose();
  next = undefined;
  await env.dispose();
});

/** A second shim over the same home and the same engine (the first one is gone). */
async function restart(overrides: Parameters<typeof makeContext>[0] = {}): Promise<TestEnv> {
  next = await makeContext({ home: env.home, docker: env.docker, ...overrides });
  return next;
}

const statusOnDisk = (taskDir: string): unknown =>
  (JSON.parse(readFileSync(join(taskDir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>).status;

/**
 * Two tasks a restart finds: one whose start was cut after its container started (changed), one
 * cut between create and start (changed and resumed).
 */
async function seedCutStarts() {
  const started = await env.seedTask({ config: { name: "started" }, status: "creating" });
  const created = await env.seedTask({
    config: { name: "created" },
    status: "pulling",
    containerState: "created",
  });
  return { started: started.task, created: created.task };
}

/** Records each step of a recovery as it begins, without changing what it does. */
function recordSteps(shim: TestEnv) {
  const steps: string[] = [];
  const { ctx, runner, reconciler } = shim;
  const scan = ctx.dirs.scan.bind(ctx.dirs);
  vi.spyOn(ctx.dirs, "scan").mockImplementation(() => (steps.push("restore"), scan()));
  const persist = runner.persister.persist.bind(runner.persister);
  const persistSpy = vi
    .spyOn(runner.persister, "persist")
    .mockImplementation((id) => (steps.push(`persist ${id}`), persist(id)));
  const tick = reconciler.tick.bind(reconciler);
  const tickSpy = vi
    .spyOn(reconciler, "tick")
    .mockImplementation((listed) => (steps.push("tick"), tick(listed)));
  const keys = runner.reconcileHostKeys.bind(runner);
  vi.spyOn(runner, "reconcileHostKeys").mockImplementation(() => (steps.push("host keys"), keys()));
  vi.spyOn(runner, "startInBackground").mockImplementation((id) => void steps.push(`resume ${id}`));
  return { steps, persist: persistSpy, tick: tickSpy };
}

describe("recover", () => {
  it("restores, persists what changed, ticks once, reconciles host keys; resumes starts only when asked", async () => {
    const { started, created } = await seedCutStarts();
    const shim = await restart();
    const { steps } = recordSteps(shim);
    const recovery = await recover(shim);
    expect([...recovery.report.changed].sort()).toEqual([started.id, created.id].sort());
    expect(steps).toEqual([
      "restore",
      ...recovery.report.changed.map((id) => `persist ${id}`),
      "tick",
      "host keys",
    ]);
    expect(recovery.report.resumed).toEqual([created.id]);
    steps.length = 0;
    recovery.resumeStarts();
    expect(steps).toEqual([`resume ${created.id}`]);
    // What the restore reconciled is durable before the first request.
    expect(statusOnDisk(started.taskDir)).toBe("running");
  });

  it("writes the changed tasks together, not one after another, and all before the tick", async () => {
    const { started, created } = await seedCutStarts();
    const shim = await restart();
    const { steps, persist } = recordSteps(shim);
    let inFlight = 0;
    let most = 0;
    const write = persist.getMockImplementation()!;
    persist.mockImplementation(async (id) => {
      most = Math.max(most, ++inFlight);
      await new Promise((resolve) => setTimeout(resolve, 20));
      inFlight--;
      return write(id);
    });
    await recover(shim);
    expect(most).toBe(2);
    expect(steps.indexOf("tick")).toBeGreaterThan(steps.indexOf(`persist ${started.id}`));
    expect(steps.indexOf("tick")).toBeGreaterThan(steps.indexOf(`persist ${created.id}`));
    expect(statusOnDisk(started.taskDir)).toBe("running");
  });

  it("an exit while the shim was down is final when it returns, from the restore's list (one list)", async () => {
    const { task } = await env.seedTask({ containerState: "exited", exitCode: 3, gpus: 1 });
    const shim = await restart();
    env.docker.resetCalls();
    await recover(shim);
    expect(shim.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      exitCode: 3,
      cleanedUp: true,
    });
    expect(statusOnDisk(task.taskDir)).toBe("terminated");
    expect(shim.ctx.gpuLock.lockedIds()).toEqual([]);
    expect(env.docker.count("listTaskContainers")).toBe(1);
  });

  it("the resumed starts run to running", async () => {
    const { created } = await seedCutStarts();
    const shim = await restart();
    const recovery = await recover(shim);
    expect(shim.ctx.store.mustGet(created.id).status).toBe("creating");
    recovery.resumeStarts();
    await shim.runner.awaitStarts();
    expect(shim.ctx.store.mustGet(created.id).status).toBe("running");
  });

  it("a failed restore fails the recovery: no write, no tick, no host keys", async () => {
    await seedCutStarts();
    const shim = await restart();
    const { steps } = recordSteps(shim);
    const failure = new Error("engine gone");
    env.docker.failNext("listTaskContainers", failure);
    await expect(recover(shim)).rejects.toBe(failure);
    expect(steps).toEqual(["restore"]);
  });

  it("a failed write of a changed task is left for the storage catch-up: the next is written, the rest runs", async () => {
    const { started, created } = await seedCutStarts();
    const shim = await restart();
    const { steps, persist } = recordSteps(shim);
    persist.mockImplementationOnce((id) => {
      steps.push(`persist ${id}`);
      return Promise.reject(new Error("read-only file system"));
    });
    const recovery = await recover(shim);
    const [first, second] = recovery.report.changed;
    expect(steps).toEqual(["restore", `persist ${first}`, `persist ${second}`, "tick", "host keys"]);
    const [failed, written] = first === started.id ? [started, created] : [created, started];
    expect(statusOnDisk(written.taskDir)).toBe(shim.ctx.store.mustGet(written.id).status);
    expect(statusOnDisk(failed.taskDir)).not.toBe(shim.ctx.store.mustGet(failed.id).status);
  });

  it("a failed first tick fails the recovery before the host keys", async () => {
    await seedCutStarts();
    const shim = await restart();
    const { steps, tick } = recordSteps(shim);
    const failure = new Error("tick failed");
    tick.mockImplementationOnce(() => {
      steps.push("tick");
      return Promise.reject(failure);
    });
    await expect(recover(shim)).rejects.toBe(failure);
    expect(steps.at(-1)).toBe("tick");
    expect(steps).not.toContain("host keys");
  });

  it("a failed host keys reconcile is logged and the recovery goes on", async () => {
    const { created } = await seedCutStarts();
    const { log, lines } = capturingLogger();
    const shim = await restart({ log });
    const failure = new Error("authorized_keys not writable");
    vi.spyOn(shim.ctx.hostKeys, "reconcile").mockRejectedValueOnce(failure);
    const recovery = await recover(shim);
    expect(recovery.report.resumed).toEqual([created.id]);
    const logged = lines
      .map((l) => JSON.parse(l) as { msg: string; level: number; err?: { message: string } })
      .filter((l) => l.msg === "host keys reconcile at startup failed");
    expect(logged.map((l) => [l.level, l.err?.message])).toEqual([[50, failure.message]]);
  });
});
