import { afterEach, describe, expect, it } from "vitest";
import { EVENT_STREAM_LIMITS } from "../api/event-streams.js";
import { HTTP_LIMITS } from "../api/server.js";
import { DEFAULT_EVENT_STREAMS, MAX_EVENT_STREAMS } from "../config/shim-config.js";
import { ShimClient } from "../control/shim-client.js";
import { newTask } from "../tasks/task.js";
import { taskConfig } from "../testing/fixtures.js";
import { buildTestApi } from "../testing/test-api.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { followEvents, type WatchEvent } from "./task-follow.js";

/*
 * `taskshim tasks watch` (followEvents) against the real HTTP edge of a shim with thousands of
 * tasks (fake engine): the opening snapshot is larger than any buffer of the stream.
 */

let env: TestEnv | undefined;
let app: ReturnType<typeof buildTestApi> | undefined;

afterEach(async () => {
  await app?.close();
  await env?.dispose();
  app = undefined;
  env = undefined;
});

async function serve(): Promise<{ port: number; env: TestEnv }> {
  env = await makeContext();
  app = buildTestApi(env);
  await app.listen({ host: "127.0.0.1", port: 0 });
  return { port: (app.server.address() as { port: number }).port, env };
}

/** Adds a task straight to the store (an `added` event), with an id `padding` characters long. */
function addTask(e: TestEnv, index: number, padding: number): void {
  // Past the submit's 128 characters: the store takes it, and the lines are as long as needed.
  const id = `t${index}-${"x".repeat(padding)}`;
  e.ctx.store.add(newTask({ ...taskConfig({ id: `t${index}`, name: `n${index}` }).config, id }));
}

async function until(what: string, condition: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

describe("tasks watch with thousands of tasks", () => {
  it("R9 an opening snapshot of 5,000 tasks (1.4 MB) arrives whole, and tasks watch then shows a live event", async () => {
    const { port, env: e } = await serve();
    for (let i = 0; i < 5_000; i++) addTask(e, i, 200);
    const seen: WatchEvent[] = [];
    const live = new Error("the live event arrived");
    const following = followEvents(
      new ShimClient(`http://127.0.0.1:${port}`),
      (event) => {
        seen.push(event);
        if (event.kind !== "present") throw live;
      },
      { timeoutMs: 15_000, retryMs: 1_000 },
    );
    await until("the snapshot", () => seen.length >= 5_000, 15_000);
    addTask(e, 5_000, 200);
    await expect(following).rejects.toBe(live);
    expect(seen.filter((event) => event.kind === "present")).toHaveLength(5_000);
    expect(seen.at(-1)).toMatchObject({ kind: "added", id: `t5000-${"x".repeat(200)}`, to: "pending" });
  }, 30_000);

  it("--max-event-streams defaults to the streams' own limit and stops where 100 connections stay free", () => {
    expect(DEFAULT_EVENT_STREAMS).toBe(EVENT_STREAM_LIMITS.maxStreams);
    expect(MAX_EVENT_STREAMS).toBe(HTTP_LIMITS.maxConnections - 100);
  });
});
