import { describe, expect, it } from "vitest";
import { heldSocketSpawn, holdApiSocket, HELD_SOCKET_ENV, serveAddress } from "./held-socket.js";

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
