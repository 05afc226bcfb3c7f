import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { acquireHomeLock, HomeLockedError } from "./home-lock.js";

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "home-lock-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

describe("acquireHomeLock", () => {
  it("lets one holder in at a time and frees the home on release", async () => {
    const first = await acquireHomeLock(home);
    await expect(acquireHomeLock(home)).rejects.toBeInstanceOf(HomeLockedError);
    await first.release();
    const second = await acquireHomeLock(home);
    await second.release();
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
});
