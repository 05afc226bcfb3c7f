import { connect, createServer, type Server } from "node:net";
import { unlink } from "node:fs/promises";
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
      // Stryker disable next-line StringLiteral: only a later server error (none is expected) would tell.
      server.off("error", reject);
      resolve();
    });
  });
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
 * Takes the home's single-instance lock: a Unix socket that only a live process can hold.
 * Unlike a pidfile it frees itself when the holder dies (even by SIGKILL), and unlike the
 * HTTP port it is tied to the home, so two shims on one home never run at once whatever
 * ports they use. Node has no flock(2); this is the portable equivalent.
 */
export async function acquireHomeLock(home: string): Promise<HomeLock> {
  const path = join(home, ".taskshim.lock");
  // Stryker disable next-line ArrowFunction: the prober destroys its socket itself; ending it here is politeness.
  const server = createServer((socket) => socket.end());
  try {
    await listen(server, path);
  } catch (error) {
    // Stryker disable next-line ConditionalExpression: for any other error the retry below fails with that same error.
    if ((error as NodeJS.ErrnoException).code !== "EADDRINUSE") throw error;
    if (await isAlive(path)) {
      throw new HomeLockedError(`another taskshim is already running with home ${home}`);
    }
    // The holder died without unlinking its socket: the file is stale.
    await unlink(path).catch(() => undefined);
    await listen(server, path);
  }
  server.unref();
  return {
    release: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
      }),
  };
}
