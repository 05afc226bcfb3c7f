import { connect, createServer, type Server, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "node:worker_threads";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { buildTestApi } from "../testing/test-api.js";
import { waitFor } from "../testing/wait-for.js";
import type { ConnectionHandoff } from "./connection-drain.js";

/**
 * A keep-alive client in its own thread (so it keeps writing requests while the shim's thread is
 * busy shutting down): one `GET /api/healthcheck` every 2 ms, open loop, until told to stop, over
 * one kept-alive connection at a time (requests queue for it; a new one is opened when the server
 * closes it). One connection, because closing a connection that sits idle always races with a
 * client that picks it at that very instant (HTTP/1.1 has no way around that): this test is about
 * the requests the close used to drop that were already written, not about that last instant.
 */
const CLIENT = `
const http = require("node:http");
const { parentPort, workerData } = require("node:worker_threads");
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
let running = true;
let sent = 0;
let answered = 0;
const failures = {};
const fail = (cause) => (failures[cause] = (failures[cause] ?? 0) + 1);
const one = () =>
  new Promise((resolve) => {
    const request = http.get(workerData.url, { agent, timeout: 10000 }, (response) => {
      response.resume();
      response.on("end", () => {
        if (response.statusCode === 200) answered++;
        else fail("status " + response.statusCode);
        resolve();
      });
    });
    request.on("timeout", () => request.destroy(new Error("timeout")));
    request.on("error", (e) => {
      fail(e.code ?? e.message);
      resolve();
    });
  });
parentPort.on("message", () => (running = false));
(async () => {
  const inFlight = new Set();
  while (running) {
    sent++;
    const p = one();
    inFlight.add(p);
    p.finally(() => inFlight.delete(p));
    await new Promise((r) => setTimeout(r, 2));
  }
  await Promise.all(inFlight);
  parentPort.postMessage({ sent, answered, failures });
})();
`;

interface ClientResult {
  sent: number;
  answered: number;
  failures: Record<string, number>;
}

let env: TestEnv;
let holder: Server | undefined;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  const listening = holder;
  holder = undefined;
  if (listening?.listening) await new Promise((resolve) => listening.close(resolve));
  await env.dispose();
});

function busyFor(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // The shutdown's own synchronous work: requests written meanwhile wait unread in the kernel.
  }
}

describe("the API's close at a restart", () => {
  it("answers every request of a keep-alive client across 30 restarts (none closed unanswered)", async () => {
    // The listening socket outlives each shim, as under `taskshim supervise` or systemd socket
    // activation: connections made while no shim accepts wait (here in `waiting`) for the next.
    let current: ReturnType<typeof buildTestApi> | undefined;
    const waiting: Socket[] = [];
    const held = createServer((socket) => {
      if (current) current.server.emit("connection", socket);
      else waiting.push(socket);
    });
    holder = held;
    await new Promise<void>((resolve) => held.listen(0, "127.0.0.1", resolve));
    const port = (held.address() as { port: number }).port;
    const start = async (): Promise<void> => {
      const app = buildTestApi(env, { drainTimes: { idleGraceMs: 50, deadlineMs: 5_000 } });
      // Listening (on a port of its own, unused) as a shim does: Node tracks the connections of
      // a listening server only, and its close() acts on those.
      await app.listen({ host: "127.0.0.1", port: 0 });
      current = app;
      for (const socket of waiting.splice(0)) app.server.emit("connection", socket);
    };
    await start();
    const client = new Worker(CLIENT, {
      eval: true,
      workerData: { url: `http://127.0.0.1:${port}/api/healthcheck` },
    });
    const result = new Promise<ClientResult>((resolve) => client.once("message", resolve));
    for (let restart = 0; restart < 30; restart++) {
      await new Promise((resolve) => setTimeout(resolve, 40));
      const old = current!;
      current = undefined;
      busyFor(20);
      await old.close();
      await start();
    }
    await new Promise((resolve) => setTimeout(resolve, 40));
    client.postMessage("stop");
    const { sent, answered, failures } = await result;
    await client.terminate();
    await current!.close();
    expect(failures).toEqual({});
    expect(answered).toBe(sent);
    expect(sent).toBeGreaterThan(200);
  }, 60_000);

  it("answers a read written on a kept-alive connection after the close began, and closes idle ones after the grace", async () => {
    const app = buildTestApi(env, { drainTimes: { idleGraceMs: 300, deadlineMs: 1_500 } });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const port = (app.server.address() as { port: number }).port;
    const open = (): Promise<{ socket: Socket; received: () => string; closed: Promise<number> }> =>
      new Promise((resolve) => {
        const socket = connect(port, "127.0.0.1", () => {
          let text = "";
          socket.on("data", (chunk) => (text += chunk.toString("latin1")));
          const openedAt = performance.now();
          const closed = new Promise<number>((done) =>
            socket.once("close", () => done(performance.now() - openedAt)),
          );
          socket.on("error", () => undefined);
          resolve({ socket, received: () => text, closed });
        });
      });
    const idle = await open();
    const asking = await open();
    // Headers that never end count as idle, as in Node's own close, only later.
    const silent = await open();
    silent.socket.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n");
    const closing = app.close();
    const closeStarted = performance.now();
    // A read written on a kept-alive connection after the close began is answered, then closed.
    asking.socket.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n\r\n");
    await asking.closed;
    expect(asking.received()).toMatch(/^HTTP\/1\.1 200 /);
    expect(asking.received()).toMatch(/\r\nconnection: close\r\n/i);
    await idle.closed;
    expect(performance.now() - closeStarted).toBeGreaterThanOrEqual(290);
    expect(idle.received()).toBe("");
    await closing;
    expect(await silent.closed).toBeGreaterThanOrEqual(290);
    expect(silent.received()).toBe("");
  });
});

describe("the API's close with requests pipelined behind a slow one", () => {
  it("R11 answers every request already executed: the close follows the last queued answer, not the one in progress", async () => {
    const { task } = await env.seedTask();
    let release!: () => void;
    const slow = new Promise<void>((resolve) => (release = resolve));
    env.docker.onNext("containerLogTail", () => slow);
    const app = buildTestApi(env, { drainTimes: { idleGraceMs: 50, deadlineMs: 5_000 } });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const socket = connect((app.server.address() as { port: number }).port, "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    let text = "";
    socket.on("data", (chunk: Buffer) => (text += chunk.toString("latin1")));
    socket.on("error", () => undefined);
    const closed = new Promise((resolve) => socket.once("close", resolve));
    const ids = [1, 2, 3, 4, 5].map((n) => `pipelined-${n}`);
    socket.write(
      `GET /api/tasks/${task.id}/logs HTTP/1.1\r\nHost: x\r\n\r\n` +
        ids
          .map((id) => {
            const body = JSON.stringify({ id, name: id, image_name: "busybox", command: ["true"] });
            return (
              `POST /api/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
            );
          })
          .join(""),
    );
    // Node runs the handlers of the pipelined submits at once; their answers wait for the logs'.
    await waitFor(() => ids.every((id) => env.ctx.store.get(id) !== undefined), { what: "the submits" });
    const closing = app.close();
    await sleep(100);
    release();
    await closed;
    await closing;
    const statuses = [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
    expect(statuses).toEqual([200, 200, 200, 200, 200, 200]);
    // Only the last answer closes the connection.
    expect(text.match(/\r\nconnection: close\r\n/gi)).toHaveLength(1);
    await env.runner.awaitStarts();
  });
});

describe("the API's close with a handoff (the next shim takes idle connections)", () => {
  /** Records what it is given; `accept: false` declines, as when the supervisor is gone. */
  function recordingHandoff(accept = true): ConnectionHandoff & { given: Socket[] } {
    const given: Socket[] = [];
    return {
      given,
      give: (socket) => {
        if (accept) given.push(socket);
        return accept;
      },
    };
  }

  async function clientOf(
    port: number,
  ): Promise<{ socket: Socket; closed: () => boolean; text: () => string }> {
    const socket = connect(port, "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    let text = "";
    let closed = false;
    socket.on("data", (chunk) => (text += chunk.toString("latin1")));
    socket.on("close", () => (closed = true));
    socket.on("error", () => undefined);
    return { socket, closed: () => closed, text: () => text };
  }

  const answered = (client: { text: () => string }): Promise<void> =>
    waitFor(() => /\r\n\r\n/.test(client.text()), { what: "an answer" });

  it("gives an idle kept-alive connection away instead of closing it, and is done once it is ended here", async () => {
    const handoff = recordingHandoff();
    const app = buildTestApi(env, { drainTimes: { idleGraceMs: 50, deadlineMs: 5_000 }, handoff });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const kept = await clientOf((app.server.address() as { port: number }).port);
    kept.socket.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n\r\n");
    await answered(kept);
    expect(kept.text()).not.toMatch(/connection: close/i);

    let settled = false;
    const closing = app.close().then(() => (settled = true));
    await waitFor(() => handoff.given.length === 1, { what: "the handoff" });
    expect(handoff.given[0]?.remotePort).toBe(kept.socket.localPort);
    // Well past the grace: neither closed for the client nor counted as done.
    await sleep(200);
    expect(kept.closed()).toBe(false);
    expect(settled).toBe(false);
    // The handoff ends it in this process (the real one once the descriptor is on its way).
    handoff.given[0]?.destroy();
    await closing;
  });

  it("keeps to the grace for a connection with a request read in part, one already ending, and when the handoff declines", async () => {
    const handoff = recordingHandoff();
    const app = buildTestApi(env, { drainTimes: { idleGraceMs: 50, deadlineMs: 5_000 }, handoff });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const port = (app.server.address() as { port: number }).port;
    const partial = await clientOf(port);
    partial.socket.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n\r\nGET /api/health");
    const ending = await clientOf(port);
    ending.socket.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    await answered(partial);
    await answered(ending);
    await app.close();
    expect(handoff.given).toEqual([]);
    await waitFor(partial.closed, { what: "the close of the one read in part" });

    const declining = recordingHandoff(false);
    const second = buildTestApi(env, {
      drainTimes: { idleGraceMs: 50, deadlineMs: 5_000 },
      handoff: declining,
    });
    await second.listen({ host: "127.0.0.1", port: 0 });
    const idle = await clientOf((second.server.address() as { port: number }).port);
    await second.close();
    expect(declining.given).toEqual([]);
    await waitFor(idle.closed, { what: "the close of the declined one" });
  });
});
