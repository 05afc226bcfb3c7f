import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { onPath } from "./on-path.js";

let dir: string;
let other: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "on-path-"));
  other = await mkdtemp(join(tmpdir(), "on-path-"));
  await writeFile(join(dir, "tool"), "#!/bin/sh\n");
  await chmod(join(dir, "tool"), 0o755);
  await writeFile(join(other, "plain"), "not executable");
  await chmod(join(other, "plain"), 0o644);
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
  await rm(other, { recursive: true, force: true });
});

describe("onPath", () => {
  it("finds an executable in any PATH directory, not a missing or non-executable one", async () => {
    const path = `${other}:${dir}`;
    expect(await onPath("tool", path)).toBe(true);
    expect(await onPath("missing", path)).toBe(false);
    // Root may read any file, but access(X_OK) still needs an execute bit.
    expect(await onPath("plain", path)).toBe(false);
    expect(await onPath("tool", other)).toBe(false);
    expect(await onPath("tool", "")).toBe(false);
  });

  it("checks a name with a slash as it is, whatever PATH says", async () => {
    expect(await onPath(join(dir, "tool"), "")).toBe(true);
    expect(await onPath(join(other, "tool"), dir)).toBe(false);
  });

  it("ignores relative PATH entries (they would depend on the working directory)", async () => {
    const fromCwd = relative(process.cwd(), dir);
    expect(await onPath("tool", fromCwd)).toBe(false);
    expect(await onPath("tool", `${fromCwd}:`)).toBe(false);
    expect(await onPath("tool", `${fromCwd}:${dir}`)).toBe(true);
  });

  it("searches the process's own PATH by default", async () => {
    expect(await onPath("sh")).toBe(true);
    expect(await onPath("no-such-program-on-any-path")).toBe(false);
  });
});
