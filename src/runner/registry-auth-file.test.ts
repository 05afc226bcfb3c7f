import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  deleteRegistryAuth,
  readRegistryAuth,
  REGISTRY_AUTH_FILE,
  writeRegistryAuth,
} from "./registry-auth-file.js";

let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-auth-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("registry-auth.json", () => {
  it("is written 0600 and read back as it was", async () => {
    await writeRegistryAuth(dir, { username: "robot$puller", password: "s3cr3t" });
    expect((await stat(join(dir, REGISTRY_AUTH_FILE))).mode & 0o777).toBe(0o600);
    expect(JSON.parse(await readFile(join(dir, "registry-auth.json"), "utf8"))).toEqual({
      username: "robot$puller",
      password: "s3cr3t",
    });
    expect(await readRegistryAuth(dir)).toEqual({ username: "robot$puller", password: "s3cr3t" });
  });

  it.each([
    ["missing", undefined],
    ["not JSON", "{not json"],
    ["without a password", JSON.stringify({ username: "u" })],
    ["with a password that is not a string", JSON.stringify({ username: "u", password: 7 })],
    ["without a username", JSON.stringify({ password: "p" })],
  ])("reads as no credentials when %s", async (_label, text) => {
    if (text !== undefined) await writeFile(join(dir, REGISTRY_AUTH_FILE), text);
    expect(await readRegistryAuth(dir)).toBeUndefined();
  });

  it("keeps only the username and password", async () => {
    await writeFile(
      join(dir, REGISTRY_AUTH_FILE),
      JSON.stringify({ username: "u", password: "p", extra: 1 }),
    );
    expect(await readRegistryAuth(dir)).toEqual({ username: "u", password: "p" });
  });

  it("is deleted, and deleting it again (or a missing one) is fine", async () => {
    await writeRegistryAuth(dir, { username: "u", password: "p" });
    await deleteRegistryAuth(dir);
    expect(existsSync(join(dir, REGISTRY_AUTH_FILE))).toBe(false);
    await expect(deleteRegistryAuth(dir)).resolves.toBeUndefined();
  });

  it("a task without a dir neither reads nor deletes a registry-auth.json of the working directory", async () => {
    // The path "" would resolve against the process's working directory.
    const stray = resolve(REGISTRY_AUTH_FILE);
    expect(existsSync(stray)).toBe(false);
    await writeFile(stray, JSON.stringify({ username: "stray", password: "stray" }));
    try {
      expect(await readRegistryAuth("")).toBeUndefined();
      await deleteRegistryAuth("");
      expect(existsSync(stray)).toBe(true);
    } finally {
      await rm(stray, { force: true });
    }
  });
});
