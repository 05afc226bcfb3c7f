import { createSocket } from "node:dgram";
import { once } from "node:events";
import { open, rm } from "node:fs/promises";
import { createServer, Socket, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ConfigError } from "../config/shim-config.js";
import { inspectInheritedSocket, listenTarget, SocketActivationError } from "./listen-target.js";

const configured = { host: "127.0.0.1", port: 10998 };

describe("listenTarget", () => {
  it("binds the configured address without LISTEN_FDS", () => {
    expect(listenTarget(configured, {}, 42)).toEqual({ kind: "address", host: "127.0.0.1", port: 10998 });
  });

  it("serves fd 3 when systemd passed one socket to this pid, and removes the variables", () => {
    const env: NodeJS.ProcessEnv = {
      LISTEN_FDS: "1",
      LISTEN_PID: "42",
      LISTEN_FDNAMES: "taskshim",
      KEEP: "x",
    };
    expect(listenTarget(configured, env, 42)).toEqual({ kind: "inherited", fd: 3 });
    expect(env).toEqual({ KEEP: "x" });
  });

  it("takes the socket when LISTEN_PID is absent", () => {
    expect(listenTarget(configured, { LISTEN_FDS: "1" }, 42)).toEqual({ kind: "inherited", fd: 3 });
  });

  it("ignores (and keeps) variables meant for another process", () => {
    const env: NodeJS.ProcessEnv = { LISTEN_FDS: "1", LISTEN_PID: "41" };
    expect(listenTarget(configured, env, 42)).toEqual({ kind: "address", host: "127.0.0.1", port: 10998 });
    expect(env.LISTEN_FDS).toBe("1");
  });

  it("U13 refuses a LISTEN_FDS or LISTEN_PID that is not a number, as a configuration error (exit 78)", () => {
    const thrown = (env: NodeJS.ProcessEnv): unknown => {
      try {
        listenTarget(configured, env, 42);
      } catch (error) {
        return error;
      }
      return undefined;
    };
    for (const env of [
      { LISTEN_FDS: "abc" },
      { LISTEN_FDS: "0" },
      { LISTEN_FDS: "2" },
      { LISTEN_FDS: "1", LISTEN_PID: "x" },
    ]) {
      expect(thrown(env)).toBeInstanceOf(ConfigError);
    }
    expect((thrown({ LISTEN_FDS: "abc" }) as Error).message).toMatch(
      /^LISTEN_FDS="abc" is not a number of sockets/,
    );
    expect(thrown({ LISTEN_FDS: "1", LISTEN_PID: "x" })).toMatchObject({
      message: 'LISTEN_PID="x" is not a process id',
    });
  });

  it("refuses any other number of sockets with a clear error", () => {
    expect(() => listenTarget(configured, { LISTEN_FDS: "2", LISTEN_PID: "42" }, 42)).toThrow(
      SocketActivationError,
    );
    expect(() => listenTarget(configured, { LISTEN_FDS: "0" }, 42)).toThrow(/exactly one socket/);
  });
});

/** The descriptor of a listening server, a bound UDP socket, a Unix socket server. */
const fdOf = (handle: unknown): number => (handle as { _handle: { fd: number } })._handle.fd;

/** A dgram socket keeps its handle under its state symbol. */
function udpFd(socket: object): number {
  const state = Object.getOwnPropertySymbols(socket).find((symbol) => symbol.description === "state symbol");
  return (socket as Record<symbol, { handle: { fd: number } }>)[state!]!.handle.fd;
}

async function listening(server: Server, where: { port: number; host: string } | string): Promise<Server> {
  server.listen(where);
  await once(server, "listening");
  return server;
}

describe("U13 inspectInheritedSocket (the real kernel's tables)", () => {
  it("takes a listening TCP socket", async () => {
    const server = await listening(createServer(), { port: 0, host: "127.0.0.1" });
    try {
      expect(await inspectInheritedSocket(fdOf(server))).toEqual({ kind: "tcp-listening" });
    } finally {
      server.close();
    }
  });

  it("refuses a UDP socket, a Unix socket, a connected TCP socket, a file and a closed descriptor, naming the descriptor", async () => {
    const udp = createSocket("udp4");
    udp.bind(0, "127.0.0.1");
    await once(udp, "listening");
    const path = join(tmpdir(), `taskshim-lt-${process.pid}.sock`);
    const unix = await listening(createServer(), path);
    const tcp = await listening(createServer(), { port: 0, host: "127.0.0.1" });
    const client = new Socket();
    client.connect((tcp.address() as { port: number }).port, "127.0.0.1");
    await once(client, "connect");
    const filePath = join(tmpdir(), `taskshim-lt-${process.pid}.txt`);
    const file = await open(filePath, "w");
    try {
      const why = async (fd: number): Promise<string> => {
        const seen = await inspectInheritedSocket(fd);
        return seen.kind === "refused" ? seen.why : seen.kind;
      };
      expect(await why(udpFd(udp))).toMatch(
        /^fd \d+ \(LISTEN_FDS=1\) is a UDP socket: taskshim serves HTTP on a TCP socket/,
      );
      expect(await why(fdOf(unix))).toBe(
        `fd ${fdOf(unix)} (LISTEN_FDS=1) is a Unix socket (${path}): taskshim serves TCP only (ListenStream=ADDRESS:PORT)`,
      );
      expect(await why(fdOf(client))).toMatch(/is a TCP socket that is not listening$/);
      expect(await why(file.fd)).toMatch(/is not a socket \(\/.*\): the socket unit passed none$/);
      expect(await why(100_000)).toBe(
        "fd 100000 (LISTEN_FDS=1) is not open: the socket unit passed no socket",
      );
    } finally {
      udp.close();
      unix.close();
      client.destroy();
      tcp.close();
      await file.close();
      await rm(filePath, { force: true });
    }
  });
});
