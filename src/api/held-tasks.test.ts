/*
 * A task this release leaves alone, through the HTTP edge: a newer taskshim's task.json (a newer
 * version, or a status this release does not know) is listed and shown read-only, and every
 * request that would change it answers 409 naming why, its file untouched.
 */
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { restoreTasks } from "../runner/restore.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { containerNameFor } from "../tasks/container-name.js";
import { buildTestApi } from "../testing/test-api.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import type { TaskInfoAnswer } from "../wire/schemas.js";

let env: TestEnv;
let app: ReturnType<typeof buildTestApi>;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  await app.close();
  await env.dispose();
});

const ID = "66a886db-86db-4cf9-8c06-8984ad15dde2";
const NAME = "train-0-0";
const DIR_NAME = containerNameFor(NAME, ID);

/** Writes `state` as the task.json of the task's dir, restores, and serves the API over it. */
async function restoredWith(state: Record<string, unknown>): Promise<string> {
  const dir = join(env.home, "runners", DIR_NAME);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const text = `${JSON.stringify(state)}\n`;
  await writeFile(join(dir, TASK_STATE_FILE), text);
  await restoreTasks(env.ctx);
  app = buildTestApi(env);
  return text;
}

const submitBody = { id: ID, name: NAME, image_name: "busybox:1.36", command: ["true"] };

describe("a task held by a newer taskshim, over HTTP", () => {
  it("S16 a newer version's task.json without its container: listed and shown as written; submit, terminate and remove answer 409; the file untouched", async () => {
    const text = await restoredWith({
      version: 2,
      id: ID,
      config: { id: ID, name: NAME, image_name: "busybox:1.36", placement: { zone: "b" } },
      status: "running",
      termination_reason: "",
      termination_message: "",
      exit_code: null,
      created_at: "2027-01-01T00:00:00.000Z",
      started_at: "2027-01-01T00:00:01.000Z",
      queue_position: 3,
    });
    const list = await app.inject({ method: "GET", url: "/api/tasks" });
    expect(list.json()).toEqual({ tasks: [{ id: ID, status: "running" }] });
    const shown = await app.inject({ method: "GET", url: `/api/tasks/${ID}` });
    expect(shown.statusCode).toBe(200);
    const message = `task ${ID} is held by a newer taskshim (task.json version 2): this release leaves it alone`;
    expect(shown.json<TaskInfoAnswer>()).toMatchObject({
      id: ID,
      status: "running",
      name: NAME,
      image_name: "busybox:1.36",
      container_name: DIR_NAME,
      container_id: "",
      exit_code: null,
      created_at: "2027-01-01T00:00:00.000Z",
      started_at: "2027-01-01T00:00:01.000Z",
      held: { kind: "newer-format", message, status: "running" },
    });
    // Never finalized as "container not found": not ours to judge.
    await env.reconciler.tick();
    expect((await app.inject({ method: "GET", url: `/api/tasks/${ID}` })).json<TaskInfoAnswer>().status).toBe(
      "running",
    );
    for (const [url, payload] of [
      ["/api/tasks", submitBody],
      [`/api/tasks/${ID}/terminate`, { termination_reason: "terminated_by_user" }],
      [`/api/tasks/${ID}/remove`, {}],
    ] as const) {
      const answer = await app.inject({ method: "POST", url, payload });
      expect([url, answer.statusCode, answer.body]).toEqual([url, 409, `request error: ${message}\n`]);
    }
    expect(await readFile(join(env.home, "runners", DIR_NAME, TASK_STATE_FILE), "utf8")).toBe(text);
  });

  it("S17 a v1 task.json with a status this release does not know: shown pending with the status as written; 409 to every change", async () => {
    const text = await restoredWith({
      version: 1,
      id: ID,
      config: { id: ID, name: NAME, image_name: "busybox:1.36" },
      termination_reason: "",
      termination_message: "",
      cleaned_up: false,
      status: "queued",
    });
    const shown = (await app.inject({ method: "GET", url: `/api/tasks/${ID}` })).json<TaskInfoAnswer>();
    const message = `task ${ID} is held by a newer taskshim (task.json status "queued"): this release leaves it alone`;
    expect(shown).toMatchObject({
      status: "pending",
      held: { kind: "newer-status", message, status: "queued" },
    });
    await env.reconciler.tick();
    const answer = await app.inject({ method: "POST", url: "/api/tasks", payload: submitBody });
    expect([answer.statusCode, answer.body]).toEqual([409, `request error: ${message}\n`]);
    expect(await readFile(join(env.home, "runners", DIR_NAME, TASK_STATE_FILE), "utf8")).toBe(text);
  });

  it("shows no `held` for a task this release owns", async () => {
    app = buildTestApi(env);
    const answer = await app.inject({ method: "POST", url: "/api/tasks", payload: submitBody });
    expect(answer.statusCode).toBe(200);
    expect(answer.json<TaskInfoAnswer>()).not.toHaveProperty("held");
  });
});
