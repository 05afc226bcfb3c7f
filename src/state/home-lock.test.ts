import { execFile } from "node:child_process";
import { connect, createServer } from "node:net";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { abstractLockName, acquireHomeLock, HomeLockedError } from "./home-lock.js";

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "home-lock-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

const socketPath = (): string => join(home, ".taskshim.lock");

describe("acquireHomeLock", () => {
  it("holds a Unix socket in the home; a second taker is refused until it is released", async () => {
    const lock = await acquireHomeLock(home);
    expect((await stat(socketPath())).isSocket()).toBe(true);
    const refused = await acquireHomeLock(home).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(HomeLockedError);
    expect((refused as Error).name).toBe("HomeLockedError");
    expect((refused as Error).message).toBe(`another taskshim is already running with home ${home}`);
    // The refused attempt left the holder's socket alone.
    expect((await stat(socketPath())).isSocket()).toBe(true);
    await lock.release();
    const again = await acquireHomeLock(home);
    await again.release();
  });

  it("knows a live holder from its answer, without waiting out the probe's 1 s timer", async () => {
    const lock = await acquireHomeLock(home);
    // With timers frozen, only the holder's accept can settle the probe.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      await expect(acquireHomeLock(home)).rejects.toBeInstanceOf(HomeLockedError);
    } finally {
      vi.useRealTimers();
      await lock.release();
    }
  }, 5_000);

  it("takes over a stale socket left by a holder killed with SIGKILL", async () => {
    // A child process takes the lock and is SIGKILLed: its socket file stays, nobody listens.
    const script =
      `require("node:net").createServer().listen(${JSON.stringify(socketPath())}, () => ` +
      `process.kill(process.pid, "SIGKILL"))`;
    await promisify(execFile)(process.execPath, ["-e", script]).catch(() => undefined);
    expect(existsSync(socketPath())).toBe(true);
    const lock = await acquireHomeLock(home);
    expect((await stat(socketPath())).isSocket()).toBe(true);
    await expect(acquireHomeLock(home)).rejects.toBeInstanceOf(HomeLockedError);
    await lock.release();
  });

  it("replaces a plain file in the way, which no process can hold", async () => {
    await writeFile(socketPath(), "not a socket");
    const lock = await acquireHomeLock(home);
    expect((await stat(socketPath())).isSocket()).toBe(true);
    await lock.release();
  });

  it("passes on other errors (a home that does not exist) as they are", async () => {
    const missing = join(home, "missing");
    const error = await acquireHomeLock(missing).catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(HomeLockedError);
    // libuv reports a socket path in a missing dir as EACCES on Linux.
    expect(["EACCES", "ENOENT"]).toContain((error as NodeJS.ErrnoException).code);
  });

  it("release resolves once the socket is closed (a new connection is refused)", async () => {
    const lock = await acquireHomeLock(home);
    await lock.release();
    const refused = await new Promise<boolean>((resolve) => {
      const socket = connect(socketPath());
      socket.once("connect", () => {
        socket.destroy();
        resolve(false);
      });
      socket.once("error", () => resolve(true));
    });
    expect(refused).toBe(true);
  });

  it.runIf(process.platform === "linux")(
    "still locks a home whose socket file cannot be made (the abstract socket holds it)",
    async () => {
      // A dir where the socket file should be: listen fails and the stale "file" cannot be
      // unlinked, as on a read-only home with a socket left by an earlier run.
      await mkdir(join(home, ".taskshim.lock"));
      const first = await acquireHomeLock(home);
      await expect(acquireHomeLock(home)).rejects.toThrow(/another taskshim is already running/);
      // The same home under another spelling is the same lock.
      await expect(acquireHomeLock(`${home}/.`)).rejects.toBeInstanceOf(HomeLockedError);
      await first.release();
      const again = await acquireHomeLock(home);
      await again.release();
    },
  );

  /** Whether something listens on the home's abstract lock socket. */
  const abstractHeld = (canonicalHome: string): Promise<boolean> =>
    new Promise((resolve) => {
      const socket = connect(abstractLockName(canonicalHome));
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });

  it.runIf(process.platform === "linux")(
    "is refused by an older shim that holds only the socket file, and lets go of its abstract socket",
    async () => {
      // An older taskshim takes only <home>/.taskshim.lock (no abstract socket).
      const older = createServer((socket) => socket.end());
      await new Promise<void>((resolve) => older.listen(socketPath(), resolve));
      try {
        const refused = await acquireHomeLock(home).catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(HomeLockedError);
        expect(await abstractHeld(home)).toBe(false);
      } finally {
        await new Promise((resolve) => older.close(resolve));
      }
    },
  );

  it.runIf(process.platform === "linux")(
    "passes on an error of the socket file that is not a storage fault, and lets go of its abstract socket",
    async () => {
      // A socket path longer than a Unix socket name may be: listen fails with EINVAL.
      const long = join(home, "x".repeat(120));
      await mkdir(long);
      const error = await acquireHomeLock(long).catch((e: unknown) => e);
      expect(error).not.toBeInstanceOf(HomeLockedError);
      expect((error as NodeJS.ErrnoException).code).toBe("EINVAL");
      expect(await abstractHeld(long)).toBe(false);
    },
  );

  it("refuses a second holder, also after the lock file or the whole home was deleted", async () => {
    const lock = await acquireHomeLock(home);
    try {
      await rm(socketPath());
      await expect(acquireHomeLock(home)).rejects.toThrow(
        `another taskshim is already running with home ${home}`,
      );
      await rm(home, { recursive: true });
      await mkdir(home);
      await expect(acquireHomeLock(home)).rejects.toThrow(HomeLockedError);
    } finally {
      await lock.release();
    }
  });

  it("names the lock after the canonical path, the same for every spelling of the home", async () => {
    const lock = await acquireHomeLock(join(home, "..", basename(home)));
    try {
      expect(lock.canonicalHome).toBe(home);
      await expect(acquireHomeLock(`${home}/.`)).rejects.toThrow(HomeLockedError);
      expect(abstractLockName(home)).toMatch(/^\0taskshim-home-lock:[0-9a-f]{64}$/);
    } finally {
      await lock.release();
    }
  });
});
