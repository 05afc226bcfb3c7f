import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  describeStorageError,
  isStorageError,
  StorageHealth,
  StorageUnavailableError,
} from "./storage-health.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "storage-health-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const enospc = (): NodeJS.ErrnoException =>
  Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });

describe("StorageHealth", () => {
  it("is ok until a durable write fails, then degraded with the error, and reports each change", () => {
    const seen: boolean[] = [];
    const health = new StorageHealth(dir, {
      observe: (up) => seen.push(up),
      now: () => 1_000,
      wallNow: () => 1_000,
    });
    expect(health.state()).toEqual({ state: "ok", since: 1_000 });
    health.markFailed(new Error("wrapped", { cause: enospc() }));
    expect(health.state()).toEqual({
      state: "degraded",
      since: 1_000,
      error: "ENOSPC: no space left on device",
    });
    health.markFailed(enospc());
    expect(seen).toEqual([true, false]);
  });

  it("a probe writes, fsyncs, renames and deletes a small file and leaves nothing behind", async () => {
    const health = new StorageHealth(join(dir, "runners"));
    expect(await health.probe()).toBeUndefined();
    expect(await readdir(join(dir, "runners"))).toEqual([]);
  });

  it("a failing probe marks the home degraded; a good one with a complete catch-up clears it", async () => {
    let caughtUp = false;
    const health = new StorageHealth(join(dir, "file", "runners"), {
      catchUp: () => Promise.resolve(caughtUp),
    });
    await writeFile(join(dir, "file"), "not a dir");
    expect(await health.check()).toBe(false);
    expect(health.state()).toMatchObject({
      state: "degraded",
      error: expect.stringMatching(/^ENOTDIR: /) as unknown,
    });
    await rm(join(dir, "file"));
    expect(await health.check()).toBe(false); // the probe passes, the catch-up does not yet
    expect(health.degraded).toBe(true);
    caughtUp = true;
    expect(await health.check()).toBe(true);
    expect(health.state().state).toBe("ok");
  });

  it("run probes every interval while degraded and stops with the signal", async () => {
    const health = new StorageHealth(dir);
    health.markFailed(enospc());
    const controller = new AbortController();
    const running = health.run(controller.signal, 10);
    while (health.degraded) await new Promise((resolve) => setTimeout(resolve, 5));
    controller.abort();
    await running;
    expect(health.state().state).toBe("ok");
  });
});

describe("storage errors", () => {
  it("are recognised by errno code, also as a cause", () => {
    expect(isStorageError(enospc())).toBe(true);
    expect(isStorageError(new Error("x", { cause: Object.assign(new Error("y"), { code: "EROFS" }) }))).toBe(
      true,
    );
    expect(isStorageError(Object.assign(new Error("gone"), { code: "ENOENT" }))).toBe(false);
    expect(isStorageError(new Error("plain"))).toBe(false);
  });

  it("StorageUnavailableError names the cause as the 503 body does", () => {
    expect(new StorageUnavailableError(new Error("w", { cause: enospc() })).message).toBe(
      "storage unavailable: ENOSPC: no space left on device",
    );
  });
});

describe("storage errors, in detail", () => {
  const coded = (code: string): NodeJS.ErrnoException =>
    Object.assign(new Error(`${code}: something, write`), { code });

  it.each([
    "ENOSPC",
    "EDQUOT",
    "EROFS",
    "EIO",
    "EPERM",
    "EACCES",
    "EFBIG",
    "ENOMEM",
    "EMFILE",
    "ENFILE",
    "EBUSY",
    "ESTALE",
    "EUCLEAN",
  ])("%s is a storage error", (code) => {
    expect(isStorageError(coded(code))).toBe(true);
  });

  it.each(["ENOENT", "EEXIST", "EINVAL", ""])("%j is not", (code) => {
    expect(isStorageError(coded(code))).toBe(false);
  });

  it("looks through at most five errors of a cause chain, and only at Errors", () => {
    const chain = (depth: number): Error => {
      let e: Error = enospc();
      for (let i = 1; i < depth; i++) e = new Error(`wrap ${i}`, { cause: e });
      return e;
    };
    expect(isStorageError(chain(5))).toBe(true);
    expect(isStorageError(chain(6))).toBe(false);
    expect(describeStorageError(chain(5))).toBe("ENOSPC: no space left on device");
    expect(describeStorageError(chain(6))).toBe("wrap 5");
    expect(isStorageError({ code: "ENOSPC" })).toBe(false);
    expect(isStorageError(Object.assign(new Error("numeric"), { code: 28 }))).toBe(false);
  });

  it("describes the innermost storage error of a chain, or the error itself when it has none", () => {
    const wrapped = new Error("EIO: outer text, write", {
      cause: Object.assign(new Error("ENOENT: no such file, open"), {
        code: "ENOENT",
        cause: Object.assign(new Error("EROFS: read-only file system, open '/x'"), { code: "EROFS" }),
      }),
    });
    expect(describeStorageError(wrapped)).toBe("EROFS: read-only file system");
    expect(describeStorageError(Object.assign(new Error("gone, really"), { code: "ENOENT" }))).toBe(
      "ENOENT: gone, really",
    );
  });

  it("StorageUnavailableError has its name, its detail and its cause", () => {
    const cause = enospc();
    const error = new StorageUnavailableError(cause);
    expect(error.name).toBe("StorageUnavailableError");
    expect(error.detail).toBe("ENOSPC: no space left on device");
    expect(error.cause).toBe(cause);
  });
});

describe("StorageHealth, in detail", () => {
  interface Logged {
    level: string;
    fields: Record<string, unknown>;
    msg: string;
  }

  it("logs the change to degraded once, keeps its start and takes the latest error", () => {
    const logged: Logged[] = [];
    let now = 1_000;
    const health = new StorageHealth(dir, {
      log: (level, fields, msg) => logged.push({ level, fields, msg }),
      now: () => now,
      wallNow: () => now,
    });
    health.markFailed(enospc());
    now = 2_000;
    health.markFailed(Object.assign(new Error("EROFS: read-only file system, open"), { code: "EROFS" }));
    expect(health.state()).toEqual({
      state: "degraded",
      since: 1_000,
      error: "EROFS: read-only file system",
    });
    expect(logged).toEqual([
      {
        level: "error",
        fields: { error: "ENOSPC: no space left on device" },
        msg: "storage degraded: durable writes fail; retrying every 2 s",
      },
    ]);
  });

  it("a check on a healthy home only probes; a recovery is observed and logged with its length", async () => {
    const logged: Logged[] = [];
    const seen: boolean[] = [];
    let catchUps = 0;
    let now = 1_000;
    const health = new StorageHealth(dir, {
      log: (level, fields, msg) => logged.push({ level, fields, msg }),
      observe: (up) => seen.push(up),
      catchUp: () => {
        catchUps++;
        return Promise.resolve(true);
      },
      now: () => now,
      wallNow: () => now,
    });
    expect(await health.check()).toBe(true);
    expect(catchUps).toBe(0);
    expect(health.state()).toEqual({ state: "ok", since: 1_000 });
    health.markFailed(enospc());
    now = 4_500;
    expect(await health.check()).toBe(true);
    expect(catchUps).toBe(1);
    expect(health.state()).toEqual({ state: "ok", since: 4_500 });
    expect(seen).toEqual([true, false, true]);
    expect(logged[1]).toEqual({
      level: "info",
      fields: { degradedMs: 3_500 },
      msg: "storage writable again; deferred writes done",
    });
  });

  it("a catch-up that throws keeps the home degraded; without a catch-up a good probe clears it", async () => {
    const failing = new StorageHealth(dir, { catchUp: () => Promise.reject(new Error("boom")) });
    failing.markFailed(enospc());
    expect(await failing.check()).toBe(false);
    expect(failing.degraded).toBe(true);
    const plain = new StorageHealth(dir);
    plain.markFailed(enospc());
    expect(await plain.check()).toBe(true);
    expect(plain.degraded).toBe(false);
  });

  it("a probe that fails after writing its file removes it", async () => {
    // A non-empty directory where the probe renames its file to: the rename fails.
    const target = join(dir, `.storage-probe-${process.pid}`);
    await mkdir(join(target, "inside"), { recursive: true });
    const health = new StorageHealth(dir);
    const error = await health.probe();
    expect(error).toBeInstanceOf(Error);
    expect(await readdir(dir)).toEqual([`.storage-probe-${process.pid}`]);
  });

  it("a probe that succeeds leaves its file's content behind nowhere and runs on a fresh dir", async () => {
    const health = new StorageHealth(join(dir, "a", "b"));
    expect(await health.probe()).toBeUndefined();
    expect(await readdir(join(dir, "a", "b"))).toEqual([]);
  });

  it("run does not probe a healthy home, and returns at once for an aborted signal", async () => {
    // The probe would fail here (a file where its dir should be) and mark the home degraded.
    await writeFile(join(dir, "file"), "not a dir");
    const health = new StorageHealth(join(dir, "file", "runners"));
    const controller = new AbortController();
    const running = health.run(controller.signal, 5);
    await new Promise((resolve) => setTimeout(resolve, 40));
    controller.abort();
    await running;
    expect(health.degraded).toBe(false);
    const aborted = new StorageHealth(join(dir, "file", "runners"));
    aborted.markFailed(enospc());
    await aborted.run(AbortSignal.abort(), 5);
    // Not probed: the error is still the one it was marked with.
    expect(aborted.state()).toMatchObject({ error: "ENOSPC: no space left on device" });
  });
});
