/*
 * The single binary starts from a V8 startup snapshot of the loaded bundle
 * (scripts/build-binary.mjs): whatever the bundle reads while loading is frozen into it.
 * scripts/snapshot-check.cjs is the build's guard against that; these run it, in Node's real
 * snapshot builder, on small bundles and on the shim's own (`npm run build`). No engine needed;
 * the binaries the upgrade, deploy and release tests build start from such a snapshot.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SHIM_BUNDLE } from "./support/shim-process.js";

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");
const CHECK = join(ROOT, "scripts/snapshot-check.cjs");

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-snapshot-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Runs the check on `source` as a bundle; its exit code and what it printed. */
async function check(source: string): Promise<{ code: number; stderr: string }> {
  const bundle = join(dir, "bundle.cjs");
  await writeFile(bundle, `#!/usr/bin/env node\n${source}\n`);
  const args = ["--snapshot-blob", join(dir, "check.blob"), "--build-snapshot", CHECK, bundle];
  try {
    const { stderr } = await exec(process.execPath, args);
    return { code: 0, stderr };
  } catch (error) {
    const failed = error as { code?: number; stderr?: string };
    return { code: failed.code ?? -1, stderr: failed.stderr ?? "" };
  }
}

describe("what a startup snapshot would freeze (scripts/snapshot-check.cjs)", () => {
  it("refuses a bundle that reads the environment, the clock, randomness or the host while loading, naming each", async () => {
    const { code, stderr } = await check(
      [
        `const home = process.env.HOME;`,
        `const at = Date.now();`,
        `const id = require("node:crypto").randomUUID();`,
        `const host = require("node:os").hostname();`,
        `const pid = process.pid;`,
        `const there = require("node:fs").existsSync("/etc/hostname");`,
      ].join("\n"),
    );
    expect(code).toBe(1);
    for (const read of [
      "env HOME",
      "Date.now()",
      "crypto.randomUUID()",
      "os.hostname()",
      "process.pid",
      "fs.existsSync()",
    ])
      expect(stderr).toContain(`the bundle reads ${read} while loading`);
    expect(stderr).toContain("6 read(s) would be frozen into the startup snapshot");
  });

  it("refuses a bundle that loads a builtin Node does not vouch for in a snapshot, naming it", async () => {
    const { code, stderr } = await check(`const { execFile } = require("node:child_process");`);
    expect(code).toBe(1);
    expect(stderr).toContain(
      "snapshot-check: the bundle loads node:child_process while loading, which Node does not vouch for in a snapshot",
    );
  });

  it("accepts the same reads inside a function the command line calls at start", async () => {
    const { code, stderr } = await check(
      [
        `function main() { return [process.env.HOME, Date.now(), require("node:crypto").randomUUID(), process.pid]; }`,
        `require("node:v8").startupSnapshot.setDeserializeMainFunction(main);`,
      ].join("\n"),
    );
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });

  it("accepts the shim's own bundle: nothing it reads while loading differs between starts", async () => {
    const { code, stderr } = await check((await readFile(SHIM_BUNDLE, "utf8")).replace(/^#!.*\n/, ""));
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });
});
