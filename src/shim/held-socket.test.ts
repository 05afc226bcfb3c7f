import { once } from "node:events";
import { createServer, type Server } from "node:net";
import { describe, expect, it } from "vitest";
import { bindWaiting, heldSocketSpawn, holdApiSocket, HELD_SOCKET_ENV, serveAddress } from "./held-socket.js";

async function occupied(): Promise<{ server: Server; port: number }> {
  const server = createServer();
  server.listen({ host: "127.0.0.1", port: 0 });
  await once(server, "listening");
  return { server, port: (server.address() as { port: number }).port };
}

describe("serveAddress", () => {
  it("resolves serve's address and port from its flags, then the environment, then the defaults", () => {
    expect(serveAddress(["--shim-home", "/tmp/h", "--shim-http-port", "12345"], {})).toEqual({
      host: "127.0.0.1",
      port: 12345,
    });
    expect(serveAddress(["--shim-http-address=0.0.0.0"], { DSTACK_SHIM_HTTP_PORT: "2222" })).toEqual({
      host: "0.0.0.0",
      port: 2222,
    });
    expect(serveAddress([], {})).toEqual({ host: "127.0.0.1", port: 10998 });
  });

  it("throws on a bad port (the caller then supervises without holding a socket)", () => {
    expect(() => serveAddress(["--shim-http-port", "99999"], {})).toThrow();
  });
});

describe("heldSocketSpawn", () => {
  it("passes fd 3 with LISTEN_FDS=1 and no LISTEN_PID (the shim's pid is not known before the spawn)", () => {
    const spawned = heldSocketSpawn({ PATH: "/bin", LISTEN_PID: "7", LISTEN_FDNAMES: "x" });
    expect(spawned.stdio).toEqual(["inherit", "inherit", "inherit", 3]);
    expect(spawned.env).toEqual({ PATH: "/bin", LISTEN_FDS: "1" });
  });
});

describe("holdApiSocket", () => {
  it("in the inner supervisor, holds fd 3 and removes the marker so no shim inherits it", async () => {
    const env: NodeJS.ProcessEnv = { [HELD_SOCKET_ENV]: "1", KEEP: "x" };
    expect(await holdApiSocket([], env)).toEqual({ kind: "hold" });
    expect(env).toEqual({ KEEP: "x" });
  });

  it("does not hold a socket it cannot bind (bad configuration)", async () => {
    expect((await holdApiSocket(["--shim-http-port", "not-a-port"], {})).kind).toBe("none");
  });
});

describe("U11 bindWaiting: a new supervisor and a port an earlier shim still holds", () => {
  it("waits for the port with a growing pause, says so once, and binds it once it is free", async () => {
    const { server, port } = await occupied();
    const waits: string[] = [];
    setTimeout(() => server.close(), 700);
    const bound = await bindWaiting({ host: "127.0.0.1", port }, { onWait: (why) => waits.push(why) });
    expect(bound.kind).toBe("bound");
    if (bound.kind === "bound") bound.server.close();
    expect(waits).toEqual([`port ${port} on 127.0.0.1 is in use`]);
  });

  it("gives up after its bound with the reason, and a stop ends the wait at once", async () => {
    const { server, port } = await occupied();
    try {
      expect(await bindWaiting({ host: "127.0.0.1", port }, { portWaitMs: 300 })).toEqual({
        kind: "none",
        why: `port ${port} on 127.0.0.1 is in use (waited 300ms for it)`,
      });
      const stop = new AbortController();
      setTimeout(() => stop.abort(), 100);
      const began = performance.now();
      expect(await bindWaiting({ host: "127.0.0.1", port }, { signal: stop.signal })).toEqual({
        kind: "stopped",
      });
      expect(performance.now() - began).toBeLessThan(1_000);
    } finally {
      server.close();
    }
  });
});
