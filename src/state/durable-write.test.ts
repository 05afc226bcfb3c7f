import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { syncDirectory, tempFilePrefix, writeFileDurably } from "./durable-write.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "durable-write-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const mode = async (path: string): Promise<number> => (await stat(path)).mode & 0o777;

describe("writeFileDurably", () => {
  it("writes the content with mode 0600 and leaves no temp file", async () => {
    const target = join(dir, "task.json");
    await writeFileDurably(target, '{"version":1}\n');
    expect(await readFile(target, "utf8")).toBe('{"version":1}\n');
    expect(await mode(target)).toBe(0o600);
    expect(await readdir(dir)).toEqual(["task.json"]);
  });

  it("replaces an existing file, including its mode", async () => {
    const target = join(dir, "task.json");
    await writeFile(target, "old content that is longer than the new one", { mode: 0o644 });
    await writeFileDurably(target, "new");
    expect(await readFile(target, "utf8")).toBe("new");
    expect(await mode(target)).toBe(0o600);
    expect(await readdir(dir)).toEqual(["task.json"]);
  });

  it("writes bytes and honours an explicit mode", async () => {
    const target = join(dir, "blob");
    await writeFileDurably(target, Uint8Array.from([0, 1, 2, 255]), 0o640);
    expect([...(await readFile(target))]).toEqual([0, 1, 2, 255]);
    expect(await mode(target)).toBe(0o640);
  });

  it("survives many writes in a row without leftovers", async () => {
    const target = join(dir, "task.json");
    await Promise.all(Array.from({ length: 20 }, (_, i) => writeFileDurably(target, `v${i}`)));
    expect(await readFile(target, "utf8")).toMatch(/^v\d+$/);
    expect(await readdir(dir)).toEqual(["task.json"]);
  });

  it("removes its temp file when the rename fails", async () => {
    const target = join(dir, "task.json");
    await mkdir(join(target, "child"), { recursive: true });
    await expect(writeFileDurably(target, "data")).rejects.toThrow();
    expect(await readdir(dir)).toEqual(["task.json"]);
    expect((await stat(target)).isDirectory()).toBe(true);
  });

  it("fails in a missing directory without creating it", async () => {
    await expect(writeFileDurably(join(dir, "missing", "task.json"), "data")).rejects.toThrow();
    expect(await readdir(dir)).toEqual([]);
  });
});

describe("tempFilePrefix", () => {
  it("is a dot file named after the target", () => {
    expect(tempFilePrefix("/home/x/runners/job-1/task.json")).toBe(".task.json.tmp-");
  });
});

describe("syncDirectory", () => {
  it("syncs an existing directory and rejects a missing one", async () => {
    await expect(syncDirectory(dir)).resolves.toBeUndefined();
    await expect(syncDirectory(join(dir, "missing"))).rejects.toThrow();
  });
});
