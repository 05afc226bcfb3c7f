import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isStorageError, StorageHealth, StorageUnavailableError } from "./storage-health.js";

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
    const health = new StorageHealth(dir, { observe: (up) => seen.push(up), now: () => 1_000 });
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
