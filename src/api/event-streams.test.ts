import { connect, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { newTask } from "../tasks/task.js";
import { taskConfig } from "../testing/fixtures.js";
import { buildTestApi } from "../testing/test-api.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import type { EventStreamLimits } from "./event-streams.js";

/*
 * GET /api/events against the real HTTP edge (fake engine): how many streams may be open, what
 * happens to a follower that does not read, and an opening snapshot larger than any buffer.
 */

let env: TestEnv | undefined;
let app: ReturnType<typeof buildTestApi> | undefined;
const sockets: Socket[] = [];

afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy();
  await app?.close();
  await env?.dispose();
  app = undefined;
  env = undefined;
});

async function serve(limits: Partial<EventStreamLimits> = {}): Promise<{ port: number; env: TestEnv }> {
  env = await makeContext();
  app = buildTestApi(env, { eventStreams: limits });
  await app.listen({ host: "127.0.0.1", port: 0 });
  return { port: (app.server.address() as { port: number }).port, env };
}

/** Adds a task straight to the store (an `added` event), with an id `padding` characters long. */
function addTask(e: TestEnv, index: number, padding = 40): void {
  // Past the submit's 128 characters: the store takes it, and the lines are as long as needed.
  const id = `t${index}-${"x".repeat(padding)}`;
  e.ctx.store.add(newTask({ ...taskConfig({ id: `t${index}`, name: `n${index}` }).config, id }));
}

/** Opens a raw connection and asks for the event stream; `read` false leaves it unread. */
async function rawEvents(port: number, read: boolean): Promise<{ socket: Socket; text: () => string }> {
  const socket = connect(port, "127.0.0.1");
  sockets.push(socket);
  let text = "";
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", resolve);
    socket.once("error", reject);
  });
  socket.on("error", () => undefined);
  socket.write("GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n");
  if (read) socket.on("data", (chunk: Buffer) => (text += chunk.toString("latin1")));
  else socket.pause();
  return { socket, text: () => text };
}

async function until(what: string, condition: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

function connections(): Promise<number> {
  return new Promise((resolve, reject) =>
    app!.server.getConnections((error, count) => (error ? reject(error) : resolve(count))),
  );
}

describe("GET /api/events: bounded streams", () => {
  it("R8 beyond --max-event-streams a new stream gets a plain-text 503 and its connection closes; every other request is still served", async () => {
    const { port } = await serve({ maxStreams: 2 });
    const first = await rawEvents(port, true);
    await rawEvents(port, false);
    await until("two streams", () => first.text().includes("200 OK"));

    const third = await rawEvents(port, true);
    await new Promise((resolve) => third.socket.once("close", resolve));
    expect(third.text()).toMatch(/^HTTP\/1\.1 503 /);
    expect(third.text()).toMatch(/content-type: text\/plain/i);
    expect(third.text()).toMatch(/connection: close/i);
    expect(third.text()).toContain(
      "too many event streams: all 2 allowed are open (--max-event-streams); try again later\n",
    );
    expect((await fetch(`http://127.0.0.1:${port}/api/healthcheck`)).status).toBe(200);
    expect((await fetch(`http://127.0.0.1:${port}/api/tasks`)).status).toBe(200);
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(metrics).toMatch(/^taskshim_event_streams 2$/m);
    expect(metrics).toMatch(/^taskshim_event_streams_refused_total 1$/m);

    // A slot freed is a slot taken again.
    first.socket.destroy();
    await until("the slot to be freed", async () =>
      /^taskshim_event_streams 1$/m.test(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()),
    );
    const again = await rawEvents(port, true);
    await until("the new stream", () => again.text().length > 0);
    expect(again.text()).toMatch(/^HTTP\/1\.1 200 /);
  });

  it("R9 a follower that does not read is cut off: its connection is destroyed, and the stream never ends as if complete", async () => {
    const { port, env: e } = await serve({ maxBacklogBytes: 16 * 1024, stallMs: 300 });
    const follower = await rawEvents(port, false);
    await until("the stream to open", async () => (await connections()) === 1);
    // Events until the kernel's buffers are full and the shim's own backlog passes its bound.
    let n = 0;
    await until(
      "the follower to be cut off",
      async () => {
        for (let i = 0; i < 200; i++) addTask(e, n++, 1_000);
        await sleep(5);
        return (await connections()) === 0;
      },
      20_000,
    );
    // What the kernel had taken still arrives; then the connection ends without the last chunk.
    let text = "";
    follower.socket.on("data", (chunk: Buffer) => (text += chunk.toString("latin1")));
    follower.socket.resume();
    await new Promise((resolve) => follower.socket.once("close", resolve));
    expect(text).toMatch(/^HTTP\/1\.1 200 /);
    expect(text.endsWith("\r\n0\r\n\r\n")).toBe(false);
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(metrics).toMatch(/^taskshim_event_streams_cut_off_total\{reason="(behind|stalled)"\} 1$/m);
    expect(metrics).toMatch(/^taskshim_event_streams 0$/m);
  }, 30_000);

  it("serializes each change once for every stream and keeps every status of a short-lived task in order", async () => {
    const { port, env: e } = await serve();
    const followers = await Promise.all([
      rawEvents(port, true),
      rawEvents(port, true),
      rawEvents(port, true),
    ]);
    await until("three streams", () => followers.every((f) => f.text().includes("200 OK")));
    addTask(e, 1);
    const id = `t1-${"x".repeat(40)}`;
    for (const status of ["preparing", "pulling", "creating", "running", "terminated"] as const) {
      e.ctx.store.modify(id, (draft) => {
        draft.status = status;
        if (status === "terminated") draft.terminationReason = "done_by_runner";
      });
    }
    await until("every change on every stream", () =>
      followers.every((f) => f.text().includes('"to":"terminated"')),
    );
    for (const follower of followers) {
      const changes = [...follower.text().matchAll(/"from":("?\w+"?),"to":"(\w+)"/g)].map(
        (m) => `${m[1]?.replaceAll('"', "")}>${m[2]}`,
      );
      expect(changes).toEqual([
        "null>pending",
        "pending>preparing",
        "preparing>pulling",
        "pulling>creating",
        "creating>running",
        "running>terminated",
      ]);
    }
  });
});
