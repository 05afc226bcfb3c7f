import { describe, expect, it } from "vitest";
import { listenTarget, SocketActivationError } from "./listen-target.js";

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

  it("refuses any other number of sockets with a clear error", () => {
    expect(() => listenTarget(configured, { LISTEN_FDS: "2", LISTEN_PID: "42" }, 42)).toThrow(
      SocketActivationError,
    );
    expect(() => listenTarget(configured, { LISTEN_FDS: "0" }, 42)).toThrow(/exactly one socket/);
  });
});
