import { execFileSync } from "node:child_process";
import {
  mkdir,
  mkdtemp,
  readFile,
  rename,
  rm,
  stat,
  symlink,
  writeFile,
  type FileHandle,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino, type Logger } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { NotRegularFileError } from "./bounded-read.js";
import { HOME_ID_FILE, HOME_ID_MAX_BYTES, HomeIdentityError, loadHomeIdentity } from "./home-identity.js";
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

describe("loadHomeIdentity, in detail", () => {
  it("names a damaged identity file and what to do about it", async () => {
    const path = join(home, HOME_ID_FILE);
    await writeFile(path, "not an id\n");
    const error = await loadHomeIdentity(home).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HomeIdentityError);
    expect((error as Error).name).toBe("HomeIdentityError");
    expect((error as Error).message).toBe(
      `the home identity ${path} is damaged: restore it, or delete it to give this home a new identity`,
    );
  });

  it("refuses an identity that is not a regular file, naming it in one line, with the cause, and writes none", async () => {
    const path = join(home, HOME_ID_FILE);
    await mkdir(path);
    const error = await loadHomeIdentity(home).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(HomeIdentityError);
    expect((error as Error).message).toBe(
      `the home identity ${path} is a directory, not a regular file: restore it, or delete it to give this home a new identity`,
    );
    expect((error as Error).cause).toBeInstanceOf(NotRegularFileError);
  });

  it("S14 refuses at once a FIFO, a symlink (even to a good identity) and an oversized file, naming each", async () => {
    const path = join(home, HOME_ID_FILE);
    const refused = async (): Promise<string> => {
      const started = performance.now();
      const error = await loadHomeIdentity(home).catch((e: unknown) => e);
      expect(performance.now() - started).toBeLessThan(1_000);
      expect(error).toBeInstanceOf(HomeIdentityError);
      return (error as Error).message;
    };
    execFileSync("mkfifo", [path]);
    expect(await refused()).toBe(
      `the home identity ${path} is a FIFO, not a regular file: restore it, or delete it to give this home a new identity`,
    );
    await rm(path);
    const elsewhere = join(home, "id-elsewhere");
    await writeFile(elsewhere, "0d6c7f0e-9a63-4d0f-8c0e-6c1d0f4e8a11\n");
    await symlink(elsewhere, path);
    expect(await refused()).toMatch(/is a symbolic link, not a regular file: restore it/);
    await rm(path);
    await writeFile(path, "x".repeat(HOME_ID_MAX_BYTES + 1));
    expect(await refused()).toMatch(/is larger than 4 KiB \(4097 bytes\): restore it/);
  });

  it("writes a new identity as one line, readable by all", async () => {
    const id = await loadHomeIdentity(home);
    const path = join(home, HOME_ID_FILE);
    expect(await readFile(path, "utf8")).toBe(`${id}\n`);
    expect((await stat(path)).mode & 0o777).toBe(0o644);
    // Surrounding blanks are not part of it.
    await writeFile(path, `  ${id}  \n\n`);
    expect(await loadHomeIdentity(home)).toBe(id);
  });
});

/** A watch over the test home with its identity (60 s timer: checks run by hand), stopped after. */
async function watching(run: (watch: HomeWatch, id: string) => Promise<void>): Promise<void> {
  const id = await loadHomeIdentity(home);
  const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
  try {
    await run(watch, id);
  } finally {
    watch.stop();
  }
}

describe("HomeWatch", () => {
  it("reports a deleted, then a replaced home as degraded", async () => {
    await watching(async (watch, id) => {
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
    });
  });

  it("S14 reports an identity replaced by a FIFO as replaced, without its check waiting on it", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
    try {
      await rm(join(home, HOME_ID_FILE));
      execFileSync("mkfifo", [join(home, HOME_ID_FILE)]);
      await watch.check();
      expect(watch.current()).toMatchObject({
        status: "degraded",
        error: `the home identity ${HOME_ID_FILE} was replaced`,
      });
    } finally {
      watch.stop();
    }
  });

  it("reports a replaced identity file", async () => {
    await watching(async (watch) => {
      await writeFile(join(home, HOME_ID_FILE), "someone-else\n");
      await watch.check();
      expect(watch.current()).toMatchObject({ status: "degraded" });
    });
  });
});

describe("HomeWatch, in detail", () => {
  interface Entry {
    level: "info" | "error";
    fields: unknown;
    message: string;
  }
  /** A logger that keeps what the watch logs. */
  function capture(): { log: Logger; entries: Entry[] } {
    const entries: Entry[] = [];
    const log = {
      info: (fields: unknown, message: string) => entries.push({ level: "info", fields, message }),
      error: (fields: unknown, message: string) => entries.push({ level: "error", fields, message }),
    } as unknown as Logger;
    return { log, entries };
  }
  const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

  it("logs a problem once with the home and the problem, and the recovery once", async () => {
    const id = await loadHomeIdentity(home);
    const { log, entries } = capture();
    const watch = await HomeWatch.start(home, id, log, 60_000);
    try {
      await watch.check();
      expect(entries).toEqual([]);
      await rm(join(home, HOME_ID_FILE));
      const before = Date.now();
      await watch.check();
      const problem = `the home identity ${HOME_ID_FILE} was deleted`;
      const degraded = watch.current();
      expect(degraded).toMatchObject({ status: "degraded", error: problem });
      expect((degraded as { since: number }).since).toBeGreaterThanOrEqual(before);
      await watch.check();
      // The same problem again is neither logged again nor re-dated.
      expect(watch.current()).toBe(degraded);
      expect(entries).toEqual([
        {
          level: "error",
          fields: { home, problem },
          message: "the shim's home was deleted or replaced: task state written now is lost to a restart",
        },
      ]);
      await writeFile(join(home, HOME_ID_FILE), "someone-else\n");
      await watch.check();
      expect(watch.current()).toMatchObject({
        status: "degraded",
        error: `the home identity ${HOME_ID_FILE} was replaced`,
      });
      expect(entries).toHaveLength(2);
      await writeFile(join(home, HOME_ID_FILE), `${id}\n`);
      await watch.check();
      await watch.check();
      expect(watch.current()).toEqual({ status: "ok" });
      expect(entries.slice(2)).toEqual([
        { level: "info", fields: { home }, message: "home is back as it was" },
      ]);
    } finally {
      watch.stop();
    }
  });

  it("reports a home moved away and replaced while the held one still exists", async () => {
    await watching(async (watch, id) => {
      await rename(home, join(base, "moved"));
      await mkdir(home);
      await writeFile(join(home, HOME_ID_FILE), `${id}\n`);
      await watch.check();
      expect(watch.current()).toMatchObject({
        status: "degraded",
        error: `home ${home} was replaced by another directory`,
      });
    });
  });

  it("reports a home path that cannot be resolved any more as unreadable, a deleted one as deleted", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
    try {
      // The home's parent moves away (the home itself still exists) and a file takes its
      // place: the path now fails with ENOTDIR, not ENOENT.
      await rename(base, `${base}-moved`);
      await writeFile(base, "a file");
      await watch.check();
      expect(watch.current()).toMatchObject({ status: "degraded", error: `home ${home} cannot be read` });
      // Now the home itself is deleted too: the held directory says so, whatever the path does.
      await rm(`${base}-moved`, { recursive: true });
      await watch.check();
      expect(watch.current()).toMatchObject({ status: "degraded", error: `home ${home} was deleted` });
    } finally {
      watch.stop();
      await rm(base, { force: true });
      await rm(`${base}-moved`, { recursive: true, force: true });
    }
  });

  it("checks by itself every interval, without keeping the process alive, and not after stop", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 10);
    const timer = (watch as unknown as { timer: NodeJS.Timeout }).timer;
    expect(timer.hasRef()).toBe(false);
    await rm(join(home, HOME_ID_FILE));
    for (let i = 0; i < 200 && watch.current().status === "ok"; i++) await sleep(10);
    expect(watch.current()).toMatchObject({ status: "degraded" });
    watch.stop();
    // A check the timer started just before stop may still be under way: let it finish first.
    await (watch as unknown as { checking: Promise<void> | undefined }).checking;
    await writeFile(join(home, HOME_ID_FILE), `${id}\n`);
    await sleep(60);
    // Stopped: nobody checked again.
    expect(watch.current()).toMatchObject({ status: "degraded" });
  });

  it("stop lets go of the held home directory", async () => {
    const id = await loadHomeIdentity(home);
    const watch = await HomeWatch.start(home, id, pino({ level: "silent" }), 60_000);
    const held = (watch as unknown as { held: FileHandle }).held;
    expect(held.fd).toBeGreaterThan(-1);
    watch.stop();
    for (let i = 0; i < 100 && held.fd !== -1; i++) await sleep(5);
    expect(held.fd).toBe(-1);
    // Stopping twice is harmless.
    watch.stop();
  });
});
