import { afterEach, describe, expect, it, vi } from "vitest";
import pkg from "../../package.json" with { type: "json" };
import { buildCli } from "./main.js";
import { formatVersion, versionInfo } from "./version-command.js";

/** Runs the real command line and returns what it wrote to stdout. */
async function run(...args: string[]): Promise<string> {
  let out = "";
  const write = vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
    out += String(chunk);
    return true;
  });
  const program = buildCli().exitOverride();
  program.configureOutput({ writeOut: (s) => (out += s) });
  try {
    await program.parseAsync(["node", "taskshim", ...args]);
  } catch (error) {
    // commander ends --version with an exit, thrown under exitOverride; only that one is expected.
    if ((error as { code?: string }).code !== "commander.version") throw error;
  } finally {
    write.mockRestore();
  }
  return out;
}

describe("taskshim version", () => {
  afterEach(() => vi.restoreAllMocks());

  it("--json prints exactly {version, commit, dirty, build_id, node, v8, platform, arch} of this process", async () => {
    const printed = JSON.parse(await run("version", "--json")) as Record<string, unknown>;
    // Unbundled (vitest): no build identity was embedded, so the defaults of src/version.ts.
    expect(printed).toEqual({
      version: pkg.version,
      commit: "unknown",
      dirty: false,
      build_id: "dev",
      node: process.versions.node,
      v8: process.versions.v8,
      platform: process.platform,
      arch: process.arch,
    });
    expect(Object.keys(printed)).toEqual([
      "version",
      "commit",
      "dirty",
      "build_id",
      "node",
      "v8",
      "platform",
      "arch",
    ]);
  });

  it("prints the one-line version first, then commit, dirty, build id, node, v8, platform and arch", async () => {
    const lines = (await run("version")).trimEnd().split("\n");
    expect(lines[0]).toBe(`taskshim version ${pkg.version}`);
    expect(lines.slice(1)).toEqual([
      "commit:   unknown",
      "dirty:    false",
      "build id: dev",
      `node:     ${process.versions.node}`,
      `v8:       ${process.versions.v8}`,
      `platform: ${process.platform}`,
      `arch:     ${process.arch}`,
    ]);
    expect(formatVersion(versionInfo())).toBe(lines.join("\n"));
  });

  it("--version stays exactly `taskshim version X.Y.Z` (dstack parses three fields)", async () => {
    expect(await run("--version")).toBe(`taskshim version ${pkg.version}\n`);
  });
});
