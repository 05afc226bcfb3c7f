import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createSocket } from "node:dgram";
import { createServer } from "node:net";
import { resolve } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { bundleNodeFlags, freePort, SHIM_BUNDLE, tempHome } from "./support/shim-process.js";
import { join } from "node:path";

/*
 * systemd socket activation (docs/operations.md): the shim serves the listening socket it inherits as fd 3
 * (LISTEN_FDS=1) instead of binding its port, so that while it is down (a crash, a restart, an
 * upgrade) a client's request waits in the held socket's backlog instead of being refused.
 * test/support/socket-holder.ts does what systemd does: hold the socket, never accept on it,
 * start the shim with it, kill -9 it, wait GAP_MS with no shim at all, start it again.
 */

const HOLDER = resolve(import.meta.dirname, "support/socket-holder.ts");
const GAP_MS = 1_500;

let holder: ChildProcess | undefined;
let output = "";

afterAll(async () => {
  holder?.stdin?.end();
  if (holder && holder.exitCode === null) await Promise.race([once(holder, "exit"), sleep(10_000)]);
});

async function healthcheck(url: string, timeoutMs: number): Promise<number> {
  const response = await fetch(`${url}/api/healthcheck`, { signal: AbortSignal.timeout(timeoutMs) });
  await response.text();
  return response.status;
}

describe("socket activation (LISTEN_FDS)", () => {
  it("serves the inherited socket, and a request made while no shim runs waits instead of being refused", async () => {
    const home = await tempHome("taskshim-sockact-");
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    // Bind, hand the socket to the holder as its fd 3, and close this process's copy.
    const socket = createServer();
    await new Promise<void>((done) => socket.listen({ host: "127.0.0.1", port }, done));
    const fd = (socket as unknown as { _handle: { fd: number } })._handle.fd;
    holder = spawn(
      process.execPath,
      [
        HOLDER,
        String(GAP_MS),
        "--",
        process.execPath,
        ...bundleNodeFlags(),
        SHIM_BUNDLE,
        "serve",
        "--shim-home",
        home,
        // Another port on purpose: the inherited socket wins over the flag.
        "--shim-http-port",
        String(await freePort()),
      ],
      { stdio: ["pipe", "pipe", "pipe", fd] },
    );
    socket.close();
    holder.stderr?.on("data", (c: Buffer) => (output += c.toString()));
    const lines = createInterface({ input: holder.stdout! });
    const events: string[] = [];
    lines.on("line", (line) => {
      output += `${line}\n`;
      if (/^(started|killed)\b/.test(line)) events.push(line.split(" ")[0]!);
    });

    const deadline = Date.now() + 20_000;
    while ((await healthcheck(url, 2_000).catch(() => 0)) !== 200) {
      if (Date.now() > deadline) throw new Error(`shim did not serve the inherited socket:\n${output}`);
      await sleep(50);
    }
    expect(output).toMatch(/"msg":"taskshim serving"/);
    expect(output).toContain(`"address":"http://127.0.0.1:${port}"`);

    holder.stdin!.write("restart\n");
    while (!events.includes("killed")) await sleep(5);
    // No shim process exists now (for GAP_MS): the request must wait, then be answered.
    const sent = performance.now();
    const status = await healthcheck(url, 30_000);
    const waitedMs = performance.now() - sent;
    expect(status).toBe(200);
    expect(waitedMs).toBeGreaterThan(GAP_MS / 2);
    expect(events).toEqual(["started", "killed", "started"]);
    console.log(
      `socket activation: a request sent while no shim ran was answered after ${Math.round(waitedMs)} ms`,
    );
  });
});

/** Runs `serve` with this environment and fd 3, and returns its exit code and what it printed. */
async function serveWith(
  env: NodeJS.ProcessEnv,
  fd3: number | "ignore",
): Promise<{ code: number | null; lines: string[] }> {
  const home = await tempHome("taskshim-sockact-bad-");
  const child = spawn(
    process.execPath,
    [
      ...bundleNodeFlags(),
      SHIM_BUNDLE,
      "serve",
      "--shim-home",
      home,
      "--shim-http-port",
      String(await freePort()),
    ],
    { stdio: ["ignore", "pipe", "pipe", fd3], env: { ...process.env, ...env } },
  );
  let output = "";
  child.stdout?.on("data", (c: Buffer) => (output += c.toString()));
  child.stderr?.on("data", (c: Buffer) => (output += c.toString()));
  const [code] = (await Promise.race([once(child, "exit"), sleep(20_000).then(() => [undefined])])) as [
    number | null,
  ];
  if (code === undefined) child.kill("SIGKILL");
  return { code, lines: output.trim().split("\n") };
}

describe("U13 socket activation misconfigured", () => {
  it("exits 78 with one line for LISTEN_FDS of 0, 2 or abc, and for a closed, UDP or Unix fd 3, before anything is restored", async () => {
    for (const fds of ["0", "2", "abc"]) {
      expect(await serveWith({ LISTEN_FDS: fds }, "ignore")).toEqual({
        code: 78,
        lines: [
          expect.stringMatching(new RegExp(`^taskshim: configuration error: LISTEN_FDS=("?)${fds}\\1`)),
        ],
      });
    }
    expect(await serveWith({ LISTEN_FDS: "1" }, "ignore")).toEqual({
      code: 78,
      // Not passed: Node's own descriptors may have taken number 3 by then.
      lines: [
        expect.stringMatching(
          /^taskshim: configuration error: fd 3 \(LISTEN_FDS=1\) is not (open|a socket \(.*\)): the socket unit passed (no socket|none)$/,
        ),
      ],
    });

    const udp = createSocket("udp4");
    udp.bind(0, "127.0.0.1");
    await once(udp, "listening");
    const state = Object.getOwnPropertySymbols(udp).find((symbol) => symbol.description === "state symbol");
    const udpFd = (udp as unknown as Record<symbol, { handle: { fd: number } }>)[state!]!.handle.fd;
    const path = join(await tempHome("taskshim-unixsock-"), "api.sock");
    const unix = createServer();
    await new Promise<void>((done) => unix.listen(path, done));
    const unixFd = (unix as unknown as { _handle: { fd: number } })._handle.fd;
    try {
      expect(await serveWith({ LISTEN_FDS: "1" }, udpFd)).toEqual({
        code: 78,
        lines: [
          expect.stringMatching(/^taskshim: configuration error: fd 3 \(LISTEN_FDS=1\) is a UDP socket/),
        ],
      });
      expect(await serveWith({ LISTEN_FDS: "1" }, unixFd)).toEqual({
        code: 78,
        lines: [
          `taskshim: configuration error: fd 3 (LISTEN_FDS=1) is a Unix socket (${path}): taskshim serves TCP only (ListenStream=ADDRESS:PORT)`,
        ],
      });
    } finally {
      udp.close();
      unix.close();
    }
  });
});
