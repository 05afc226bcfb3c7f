import { spawn, type ChildProcess } from "node:child_process";
import { connect, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { alive } from "./support/dockerd.js";
import { bundleNodeFlags, freePort, SHIM_BUNDLE, tempHome } from "./support/shim-process.js";

/*
 * Under `taskshim supervise`, a kept-alive API connection outlives the shim that accepted it: the
 * draining shim gives it to the supervisor, which gives it to the next shim (connection-handoff.ts).
 */

let supervisor: ChildProcess;
let log = "";
let port: number;

const HEALTHCHECK = "GET /api/healthcheck HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/** The pids of the shims the supervisor started, in order. */
function shimPids(): number[] {
  return [...log.matchAll(/"msg":"shim started"[^\n]*"pid":(\d+)/g)].map((m) => Number(m[1]));
}

async function until(
  what: string,
  condition: () => boolean | Promise<boolean>,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}:\n${log}`);
    await sleep(5);
  }
}

/** One HTTP/1.1 exchange on a kept-alive raw socket: the status and headers of the answer. */
function exchange(socket: Socket, request: string): Promise<{ status: number; head: string }> {
  return new Promise((resolve, reject) => {
    let data = "";
    const onData = (chunk: Buffer): void => {
      data += chunk.toString("latin1");
      const end = data.indexOf("\r\n\r\n");
      if (end < 0) return;
      const head = data.slice(0, end);
      const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      if (data.length < end + 4 + length) return;
      done();
      resolve({ status: Number(head.split(" ")[1]), head });
    };
    const onEnd = (): void => {
      done();
      reject(new Error(`connection closed before an answer (read: ${JSON.stringify(data)})`));
    };
    const done = (): void => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("error", onEnd);
    };
    if (socket.destroyed || socket.readableEnded) {
      reject(new Error("connection closed before the request was written"));
      return;
    }
    const timer = setTimeout(() => {
      done();
      reject(new Error(`no answer in 15 s (read: ${JSON.stringify(data)})`));
    }, 15_000);
    socket.once("close", () => clearTimeout(timer));
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("error", onEnd);
    socket.write(request);
  });
}

beforeAll(async () => {
  port = await freePort();
  supervisor = spawn(
    process.execPath,
    [
      ...bundleNodeFlags(),
      SHIM_BUNDLE,
      "supervise",
      "--handoff-delay",
      "200ms",
      "--",
      "--shim-home",
      await tempHome(),
      "--shim-http-port",
      String(port),
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  supervisor.stdout?.on("data", (c: Buffer) => (log += c.toString()));
  supervisor.stderr?.on("data", (c: Buffer) => (log += c.toString()));
  await until("the first shim", async () => {
    const answer = await fetch(`http://127.0.0.1:${port}/api/healthcheck`).catch(() => undefined);
    return answer?.status === 200;
  });
});

afterAll(async () => {
  supervisor?.kill("SIGTERM");
  await new Promise((resolve) => supervisor?.once("exit", resolve));
});

describe("a kept-alive connection across a restart under supervise", () => {
  it("U7 is served by the next shim: a request written on it while no shim runs is answered", async () => {
    const socket = connect(port, "127.0.0.1");
    try {
      const first = await exchange(socket, HEALTHCHECK);
      expect(first.status).toBe(200);
      expect(first.head).not.toMatch(/connection: close/i);
      const [old] = shimPids();
      expect(old).toBeDefined();

      const shutdown = await fetch(`http://127.0.0.1:${port}/api/shutdown`, {
        method: "POST",
        body: "{}",
        headers: { "content-type": "application/json" },
      });
      expect(shutdown.status).toBe(200);
      await until("the first shim to exit", () => !alive(old!));
      // The supervisor waits 200 ms before the next start: no shim runs now.
      expect(shimPids()).toHaveLength(1);
      const second = await exchange(socket, HEALTHCHECK);
      expect(second.status).toBe(200);
      expect(shimPids()).toHaveLength(2);
      // The same connection, still kept alive, now by the second shim.
      const third = await exchange(socket, HEALTHCHECK);
      expect(third.status).toBe(200);
    } finally {
      socket.destroy();
    }
  });
});
