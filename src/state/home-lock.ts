import { createHash } from "node:crypto";
import { connect, createServer, type Server } from "node:net";
import { realpath, unlink } from "node:fs/promises";
import { join } from "node:path";

/** Another shim already serves this home. */
export class HomeLockedError extends Error {
  override readonly name = "HomeLockedError";
}

/** A held single-instance lock; `release()` frees it. */
export interface HomeLock {
  release(): Promise<void>;
}

function listen(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => {
      server.off("error", reject);
      resolve();
    });
  });
}

function isAlive(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(path);
    const timer = setTimeout(() => done(true), 1_000);
    function done(alive: boolean): void {
      clearTimeout(timer);
      socket.destroy();
      resolve(alive);
    }
    socket.once("connect", () => done(true));
    socket.once("error", () => done(false));
  });
}

/**
 * Takes the home's single-instance lock: a Unix socket that only a live process can hold.
 * Unlike a pidfile it frees itself when the holder dies (even by SIGKILL), and unlike the
 * HTTP port it is tied to the home, so two shims on one home never run at once whatever
 * ports they use. Node has no flock(2); this is the portable equivalent.
 */
export async function acquireHomeLock(home: string): Promise<HomeLock> {
  const path = join(home, ".taskshim.lock");
  // Linux: an abstract socket named after the home holds the lock too. It needs no file, so a
  // read-only (or full) home can still be locked; the file socket is kept beside it for
  // operators (`ss -xlp`) and for shims that know only the file.
  const held: Server[] = [];
  const release = (): Promise<void> =>
    Promise.all(held.map((s) => new Promise<void>((resolve) => s.close(() => resolve())))).then(
      () => undefined,
    );
  if (process.platform === "linux") {
    const abstract = createServer((socket) => socket.end());
    try {
      await listen(abstract, await abstractName(home));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EADDRINUSE") {
        throw new HomeLockedError(`another taskshim is already running with home ${home}`);
      }
      throw error;
    }
    abstract.unref();
    held.push(abstract);
  }
  const server = createServer((socket) => socket.end());
  try {
    try {
      await listen(server, path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EADDRINUSE") throw error;
      if (await isAlive(path)) {
        throw new HomeLockedError(`another taskshim is already running with home ${home}`);
      }
      // The holder died without unlinking its socket: the file is stale.
      await unlink(path).catch(() => undefined);
      await listen(server, path);
    }
    server.unref();
    held.push(server);
  } catch (error) {
    // Without the file (a read-only or full home; or a stale file that cannot be unlinked) the
    // abstract socket alone holds the lock.
    if (held.length === 0 || error instanceof HomeLockedError || !fileUnusable(error)) {
      await release();
      throw error;
    }
  }
  return { release };
}

/** The home's file system cannot hold the socket file (read-only, full, failing, immutable). */
function fileUnusable(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException).code ?? "";
  return ["EROFS", "ENOSPC", "EDQUOT", "EIO", "EPERM", "EACCES", "EADDRINUSE"].includes(code);
}

/** The abstract socket name of a home: the same for every spelling of its path. */
async function abstractName(home: string): Promise<string> {
  const real = await realpath(home).catch(() => home);
  return `\0taskshim-home-lock:${createHash("sha256").update(real).digest("hex").slice(0, 40)}`;
}
