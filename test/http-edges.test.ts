import { rm, writeFile } from "node:fs/promises";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ShimProcess, tempHome } from "./support/shim-process.js";

const tempDirs: string[] = [];
async function tempDir(prefix: string): Promise<string> {
  const dir = await tempHome(prefix);
  tempDirs.push(dir);
  return dir;
}

/*
 * The HTTP edge of a real shim: a client that trickles its body is cut (whole request within
 * 30 s), also after a 401; at most 1,000 connections (more are refused and counted); the bearer
 * scheme in any case.
 */

const TOKEN = "edge-token-0123456789abcdef";
let shim: ShimProcess;

beforeAll(async () => {
  const home = await tempDir("taskshim-edge-");
  const tokenFile = join(home, "token");
  await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  shim = await ShimProcess.start({ home, args: ["--auth-token-file", tokenFile] });
});

afterAll(async () => {
  await shim?.stop();
  for (const dir of tempDirs.splice(0))
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
});

function open(): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(shim.port, "127.0.0.1", () => resolve(socket));
    socket.once("error", reject);
  });
}

/**
 * Sends the headers of a POST with a 1,000-byte body, then one byte every 5 s; resolves with
 * what was answered and how long the connection lived.
 */
async function trickle(authorization: string): Promise<{ answer: string; aliveMs: number }> {
  const socket = await open();
  const started = Date.now();
  let answer = "";
  socket.on("data", (chunk: Buffer) => (answer += chunk.toString("latin1")));
  socket.on("error", () => undefined);
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  socket.write(
    `POST /api/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: ${authorization}\r\n` +
      `Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`,
  );
  const timer = setInterval(() => socket.write(" "), 5_000);
  await Promise.race([closed, sleep(60_000)]);
  clearInterval(timer);
  socket.destroy();
  return { answer, aliveMs: Date.now() - started };
}

describe("HTTP edges of a real shim", () => {
  it("cuts a client trickling its body within 35 s, with or without a valid token", async () => {
    const [authorized, refused] = await Promise.all([
      trickle(`Bearer ${TOKEN}`),
      trickle("Bearer wrong-token"),
    ]);
    console.log(`slow body cut after ${authorized.aliveMs} ms (valid token), ${refused.aliveMs} ms (401)`);
    expect(authorized.aliveMs).toBeLessThan(35_000);
    expect(authorized.answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(authorized.answer).toMatch(/content-type: text\/plain/i);
    expect(refused.aliveMs).toBeLessThan(35_000);
    expect(refused.answer).toMatch(/^HTTP\/1\.1 401 /);
  }, 90_000);

  it("accepts a lowercase bearer scheme", async () => {
    const response = await fetch(`${shim.url}/api/tasks`, { headers: { authorization: `bearer ${TOKEN}` } });
    expect(response.status).toBe(200);
  });

  it("refuses connections beyond 1,000 and counts them", async () => {
    const sockets: Socket[] = [];
    try {
      for (let i = 0; i < 1_000; i++) sockets.push(await open());
      await sleep(200);
      const extra = await open();
      const closedAt = await new Promise<number>((resolve) => {
        extra.once("close", () => resolve(Date.now()));
        extra.on("error", () => undefined);
        extra.write("GET /api/healthcheck HTTP/1.1\r\nHost: x\r\n\r\n");
      });
      expect(closedAt).toBeGreaterThan(0);
    } finally {
      for (const socket of sockets) socket.destroy();
    }
    await sleep(200);
    const metrics = await fetch(`${shim.url}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } });
    const line = (await metrics.text())
      .split("\n")
      .find((l) => l.startsWith("taskshim_http_connections_refused_total "));
    expect(Number(line?.split(" ")[1])).toBeGreaterThanOrEqual(1);
  });
});
