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
  /** The home's canonical path the lock is named after. */
  readonly canonicalHome: string;
  release(): Promise<void>;
}

function listen(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => {
      // Stryker disable next-line StringLiteral: only a later server error (none is expected) would tell.
      server.off("error", reject);
      resolve();
    });
  });
}

function close(server: Server): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()));
}

function isAlive(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(path);
    // Stryker disable next-line ArrowFunction,BooleanLiteral: a listener that neither accepts nor refuses (a full backlog) cannot be staged in a test.
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
 * The Linux abstract-namespace socket name of a home's lock: a NUL byte, then a fixed prefix and
 * the SHA-256 of the home's canonical path (a path can be longer than the 107 bytes a socket
 * name may have). It lives in the kernel, not in the file system: no `rm` can delete it, and it
 * vanishes with the process that holds it, even after SIGKILL.
 */
export function abstractLockName(canonicalHome: string): string {
  return `\0taskshim-home-lock:${createHash("sha256").update(canonicalHome).digest("hex")}`;
}

const alreadyRunning = (home: string): HomeLockedError =>
  new HomeLockedError(`another taskshim is already running with home ${home}`);

/** The home's file system cannot hold the socket file (read-only, full, failing, immutable). */
function fileUnusable(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException).code ?? "";
  return ["EROFS", "ENOSPC", "EDQUOT", "EIO", "EPERM", "EACCES", "EADDRINUSE"].includes(code);
}

/**
 * Takes the home's single-instance lock. Two parts:
 *
 * - on Linux, an abstract-namespace Unix socket named after the home's canonical path: the
 *   authority, because deleting the lock file or the whole home cannot free it, and it needs no
 *   file, so a read-only or full home can still be locked;
 * - the socket file `<home>/.taskshim.lock`, as earlier taskshim versions take it, so that an
 *   older shim on the same home is refused too (and refuses this one). Where the home cannot
 *   hold it (read-only, full, a stale file that cannot be unlinked), the abstract socket alone
 *   holds the lock.
 *
 * Both free themselves when the holder dies (unlike a pidfile). Node has no flock(2); these are
 * its equivalent.
 */
export async function acquireHomeLock(home: string): Promise<HomeLock> {
  const canonicalHome = await realpath(home);
  let abstract: Server | undefined;
  if (process.platform === "linux") {
    abstract = createServer((socket) => socket.end());
    try {
      await listen(abstract, abstractLockName(canonicalHome));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EADDRINUSE") throw alreadyRunning(home);
      throw error;
    }
    abstract.unref();
  }
  const path = join(home, ".taskshim.lock");
  // Stryker disable next-line ArrowFunction: the prober destroys its socket itself; ending it here is politeness.
  const file = createServer((socket) => socket.end());
  // Stryker disable next-line BooleanLiteral: closing a server that never listened calls back at once (ERR_SERVER_NOT_RUNNING), which close() ignores.
  let fileHeld = false;
  try {
    try {
      await listen(file, path);
    } catch (error) {
      // Stryker disable next-line ConditionalExpression: for any other error the retry below fails with that same error.
      if ((error as NodeJS.ErrnoException).code !== "EADDRINUSE") throw error;
      if (await isAlive(path)) throw alreadyRunning(home);
      // The holder died without unlinking its socket: the file is stale.
      await unlink(path).catch(() => undefined);
      await listen(file, path);
    }
    file.unref();
    fileHeld = true;
  } catch (error) {
    if (!abstract || error instanceof HomeLockedError || !fileUnusable(error)) {
      if (abstract) await close(abstract);
      throw error;
    }
  }
  return {
    canonicalHome,
    release: async () => {
      if (fileHeld) await close(file);
      if (abstract) await close(abstract);
    },
  };
}
