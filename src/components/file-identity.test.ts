import { mkdtemp, rename, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { fileIdentity, identityOf, sameFile, type FileIdentity } from "./file-identity.js";

let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-identity-"));
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("file identity", () => {
  it("is the inode, size and times of stat, as decimal strings", async () => {
    const path = join(dir, "f");
    await writeFile(path, "12345");
    const stats = await stat(path, { bigint: true });
    const expected = {
      dev: stats.dev.toString(),
      ino: stats.ino.toString(),
      size: "5",
      mtimeNs: stats.mtimeNs.toString(),
      ctimeNs: stats.ctimeNs.toString(),
    };
    expect(identityOf(stats)).toEqual(expected);
    expect(await fileIdentity(path)).toEqual(expected);
  });

  it("is undefined for a path that cannot be stat'ed", async () => {
    expect(await fileIdentity(join(dir, "missing"))).toBeUndefined();
  });

  it("tells the same file from another inode or a rewrite", async () => {
    const path = join(dir, "f");
    await writeFile(path, "one");
    const first = await fileIdentity(path);
    expect(sameFile(first, await fileIdentity(path))).toBe(true);
    await writeFile(join(dir, "g"), "one");
    await rename(join(dir, "g"), path);
    expect(sameFile(first, await fileIdentity(path))).toBe(false);
  });

  it("needs every field equal, and both known", () => {
    const a: FileIdentity = { dev: "1", ino: "2", size: "3", mtimeNs: "4", ctimeNs: "5" };
    expect(sameFile(a, { ...a })).toBe(true);
    for (const field of ["dev", "ino", "size", "mtimeNs", "ctimeNs"] as const) {
      expect(sameFile(a, { ...a, [field]: "9" }), field).toBe(false);
      expect(sameFile({ ...a, [field]: "9" }, a), field).toBe(false);
    }
    expect(sameFile(undefined, a)).toBe(false);
    expect(sameFile(a, undefined)).toBe(false);
    expect(sameFile(undefined, undefined)).toBe(false);
  });
});
