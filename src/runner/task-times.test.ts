/*
 * A task's times in their one order, created_at ≤ started_at ≤ finished_at wherever set, on every
 * path: a container that exits the moment it starts while the start's `running` commit is slow,
 * a start that adopts a container which already ran, and a restore from a task.json (written by
 * an older version) or a container whose times are inverted.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { encodeTaskState, readTaskState, TASK_STATE_FILE } from "../state/task-state-file.js";
import type { Task } from "../tasks/task.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { armFailpoints } from "./failpoints.js";
import { restoreTasks } from "./restore.js";

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
async function restart(): Promise<TestEnv> {
  const next = await makeContext({ home: env.home, docker: env.docker });
  extraEnvs.push(next);
  return next;
}

/** The three times as memory (what the API shows) and task.json hold them. */
function timesOf(task: Task): number[][] {
  const disk = readTaskState(task.taskDir);
  const ms = (iso: string | null | undefined): number | undefined => (iso ? Date.parse(iso) : undefined);
  const defined = (values: (number | undefined)[]): number[] => values.filter((v) => v !== undefined);
  return [
    defined([task.createdAt, task.startedAt, task.finishedAt]),
    defined([ms(disk.created_at), ms(disk.started_at), ms(disk.finished_at)]),
  ];
}

const ascending = (values: number[]): number[] => [...values].sort((a, b) => a - b);

function expectOrdered(views: number[][], count = 3): void {
  for (const view of views) {
    expect(view).toHaveLength(count);
    expect(view).toEqual(ascending(view));
  }
}

describe("a container that exits at once while the start's commit is slow", () => {
  it.each([
    ["the start's persist is delayed (failpoint)", "after-start-before-persist=1*delay(300)", 300],
    ["every task.json write is slow", "durable-write:task-state=delay(150)", 150],
  ])("%s: started_at is the start's, before finished_at", async (_case, failpoints, slowMs) => {
    const submitted = await env.submit({});
    armFailpoints(failpoints);
    let started = 0;
    env.docker.afterNext("startContainer", () => {
      const container = env.docker.mustFind(submitted.containerName);
      env.docker.exit(container.id, 0);
      started = Date.now();
    });
    await env.runner.awaitStarts();
    const committed = Date.now();
    await env.reconciler.tick();
    const task = env.ctx.store.mustGet(submitted.id);
    expect(task).toMatchObject({ status: "terminated", terminationReason: "done_by_runner" });
    // The time the start call returned, taken before the slow commit, not the commit's.
    expect(task.startedAt! - started).toBeGreaterThanOrEqual(0);
    expect(task.startedAt! - started).toBeLessThan(slowMs / 2);
    expect(committed - task.startedAt!).toBeGreaterThanOrEqual(slowMs);
    expectOrdered(timesOf(task));
  });

  it("bridge mode: the engine's own StartedAt and FinishedAt, exactly", async () => {
    const submitted = await env.submit({ network_mode: "bridge" });
    armFailpoints("after-start-before-persist=1*delay(300)");
    env.docker.afterNext("startContainer", () => {
      const container = env.docker.mustFind(submitted.containerName);
      container.startedAt = new Date(Date.now() - 2).toISOString();
      env.docker.exit(container.id, 1, { logs: ["bye"] });
    });
    await env.runner.awaitStarts();
    await env.reconciler.tick();
    const task = env.ctx.store.mustGet(submitted.id);
    const container = env.docker.mustFind(submitted.containerName);
    expect(task).toMatchObject({ status: "terminated", terminationReason: "container_exited_with_error" });
    expect(task.startedAt).toBe(Date.parse(container.startedAt));
    expect(task.finishedAt).toBe(Date.parse(container.finishedAt));
    expectOrdered(timesOf(task));
  });
});

describe("a start that adopts its container", () => {
  it("keeps the StartedAt of a container that already ran, not the time of the commit", async () => {
    const { task: seeded, container } = await env.seedTask({ status: "creating", containerState: "exited" });
    // A seeded task has no submit time: only the start and finish are compared.
    const created = Date.now();
    container!.startedAt = new Date(created + 1_000).toISOString();
    container!.finishedAt = new Date(created + 2_000).toISOString();
    await env.runner.start(seeded.id);
    const running = env.ctx.store.mustGet(seeded.id);
    expect(running.status).toBe("running");
    expect(running.startedAt).toBe(created + 1_000);
    await env.reconciler.tick();
    const task = env.ctx.store.mustGet(seeded.id);
    expect(task).toMatchObject({
      status: "terminated",
      startedAt: created + 1_000,
      finishedAt: created + 2_000,
    });
    expectOrdered(timesOf(task), 2);
  });
});

describe("a restore whose times are inverted", () => {
  /** Rewrites the task's task.json with these times (as an older version may have written it). */
  async function writeTimes(task: Task, times: Pick<Task, "createdAt" | "startedAt" | "finishedAt">) {
    const { createdAt: _c, startedAt: _s, finishedAt: _f, ...rest } = task;
    await writeFile(join(task.taskDir, TASK_STATE_FILE), encodeTaskState({ ...rest, ...times }, "boot"));
  }

  it("raises a finish time before the start (task.json) to the start, in memory and task.json", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "exited", exitCode: 0 });
    const t = 1_790_000_000_000;
    await writeTimes(task, { createdAt: t, startedAt: t + 5_000, finishedAt: t + 2_000 });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect([restored.createdAt, restored.startedAt, restored.finishedAt]).toEqual([t, t + 5_000, t + 5_000]);
    // Persisted at startup: a rolled-back release reading the file then shows the same times.
    expect(report.changed).toContain(task.id);
    await next.reconciler.tick();
    expectOrdered(timesOf(next.ctx.store.mustGet(task.id)));
  });

  it("raises a container's StartedAt before the submit to the submit", async () => {
    const { task, container } = await env.seedTask({});
    const t = 1_790_000_000_000;
    await writeTimes(task, { createdAt: t });
    container!.startedAt = new Date(t - 3_000).toISOString();
    const next = await restart();
    await restoreTasks(next.ctx);
    const restored = next.ctx.store.mustGet(task.id);
    expect([restored.createdAt, restored.startedAt, restored.finishedAt]).toEqual([t, t, undefined]);
  });

  it("a container that exited while the shim was down, before the start task.json recorded", async () => {
    const { task, container } = await env.seedTask({});
    const t = 1_790_000_000_000;
    // An older version stamped started_at when its slow commit landed, after the instant exit.
    await writeTimes(task, { createdAt: t, startedAt: t + 3_000 });
    env.docker.exit(container!.id, 0);
    container!.finishedAt = new Date(t + 10).toISOString();
    const next = await restart();
    await restoreTasks(next.ctx);
    await next.reconciler.tick();
    const finalized = next.ctx.store.mustGet(task.id);
    expect(finalized).toMatchObject({ status: "terminated", terminationReason: "done_by_runner" });
    expect([finalized.startedAt, finalized.finishedAt]).toEqual([t + 3_000, t + 3_000]);
    expectOrdered(timesOf(finalized));
  });
});
