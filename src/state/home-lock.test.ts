import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HOME_ID_FILE, HomeIdentityError, loadHomeIdentity } from "./home-identity.js";
import { abstractLockName, acquireHomeLock, HomeLockedError, type HomeLock } from "./home-lock.js";
import { HomeWatch } from "./home-watch.js";

let base: string;
let home: string;
const held: HomeLock[] = [];
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "taskshim-lock-"));
  home = join(base, "home");
  await mkdir(home);
});
afterEach(async () => {
  for (const lock of held.splice(0)) await lock.release();
  await rm(base, { recursive: true, force: true });
});

async function take(path = home): Promise<HomeLock> {
  const lock = await acquireHomeLock(path);
  held.push(lock);
  return lock;
}

describe("acquireHomeLock", () => {
  it("refuses a second holder, also after the lock file or the whole home was deleted", async () => {
    await take();
    await expect(acquireHomeLock(home)).rejects.toThrow(HomeLockedError);
    await rm(join(home, ".taskshim.lock"));
    await expect(acquireHomeLock(home)).rejects.toThrow(
      `another taskshim is already running with home ${home}`,
    );
    await rm(home, { recursive: true });
    await mkdir(home);
    await expect(acquireHomeLock(home)).rejects.toThrow(HomeLockedError);
  });

  it("is free again once released, and names the lock after the canonical path", async () => {
    const lock = await acquireHomeLock(home);
    await lock.release();
    await take(join(base, "home", "..", "home"));
    expect(held[0]?.canonicalHome).toBe(home);
    await expect(acquireHomeLock(join(base, ".", "home"))).rejects.toThrow(HomeLockedError);
    expect(abstractLockName(home)).toMatch(/^\0taskshim-home-lock:[0-9a-f]{64}$/);
  });
});

describe("loadHomeIdentity", () => {
  it("creates an identity once and reads the same one later; a damaged one is refused", async () => {
    const id = await loadHomeIdentity(home);
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(await loadHomeIdentity(home)).toBe(id);
    await writeFile(join(home, HOME_ID_FILE), "not an id\n");
    await expect(loadHomeIdentity(home)).rejects.toThrow(HomeIdentityError);
  });
});

describe("HomeWatch", () => {
  it("reports a deleted, then a replaced home as degraded", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
    try {
      await watch.check();
      expect(watch.current()).toEqual({ status: "ok" });
      await rm(home, { recursive: true });
      await watch.check();
      expect(watch.current()).toMatchObject({ status: "degraded", error: `home ${home} was deleted` });
      await mkdir(home);
      await writeFile(join(home, HOME_ID_FILE), `${id}\n`);
      await watch.check();
      expect(watch.current()).toMatchObject({
        status: "degraded",
        error: `home ${home} was replaced by another directory`,
      });
    } finally {
      watch.stop();
    }
  });

  it("reports a replaced identity file", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
    try {
      await writeFile(join(home, HOME_ID_FILE), "someone-else\n");
      await watch.check();
      expect(watch.current()).toMatchObject({ status: "degraded" });
    } finally {
      watch.stop();
    }
  });
});
