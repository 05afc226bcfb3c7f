import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HOME_ID_FILE, HomeIdentityError, loadHomeIdentity } from "./home-identity.js";
import { HomeWatch } from "./home-watch.js";

let base: string;
let home: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "taskshim-home-"));
  home = join(base, "home");
  await mkdir(home);
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
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
