// Builds dist/taskshim: one executable that needs no Node on the host (Node's single executable
// application support: `node --build-sea` writes the bundle as a blob into a copy of this very
// node binary, the pinned Node.js of package.json, so the blob always comes from the same version
// as the executable that reads it).
// Test builds may override the output, the version and the state-file format; a release's arm64
// binary (scripts/release-artifacts.mjs) names another Node.js to inject into:
//   node scripts/build-binary.mjs [--outfile F] [--version X.Y.Z] [--state-version N]
//                                 [--start-from snapshot|code-cache|source] [--executable NODE --arch ARCH]
// --start-from: what the binary starts from (default snapshot):
// - snapshot: a V8 startup snapshot of the loaded bundle (`useSnapshot`): a start deserializes the
//   heap the bundle's loading left and runs the command line (src/main.ts), with no compiling and
//   no module evaluation (`taskshim --version` 1.6x `node -e 0` against 3x, BENCHMARKS.md). What
//   the bundle reads while loading would be frozen into it: scripts/snapshot-check.cjs fails the
//   build if it reads anything that differs per start (the environment, clocks, randomness, the
//   host, files);
// - code-cache: the bundle's source and V8's code cache of it (`useCodeCache`), compiled at start;
// - source: the bundle's source alone, compiled at every start.
// A snapshot and a code cache are made by this process's V8, so only for this node's arch.
import { execFileSync, spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { parseArgs } from "node:util";
import "./check-node.mjs";
import { expectElfArch } from "./elf.mjs";
import { NODE_FLAGS } from "./node-flags.mjs";

// Any failure is one line, not a stack trace: `npm run build:binary` and release-artifacts.mjs
// show it as it is. (The `finally` below has run by then: nothing partial is left.)
process.on("uncaughtException", (err) => {
  console.error(`build-binary: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});

const { values } = parseArgs({
  options: {
    outfile: { type: "string", default: "dist/taskshim" },
    version: { type: "string" },
    "state-version": { type: "string" },
    "start-from": { type: "string", default: "snapshot" },
    // The official Node.js binary of another arch, of this very version (the blob --build-sea
    // writes is read by the executable it goes into: same version, as for the default below), and
    // that arch, checked against the file's ELF header and hashed into the build id.
    executable: { type: "string" },
    arch: { type: "string" },
  },
});

/** A build the options cannot describe: told with one line, before anything is written. */
class BuildBinaryUsageError extends Error {
  name = "BuildBinaryUsageError";
}
if ((values.executable === undefined) !== (values.arch === undefined)) {
  throw new BuildBinaryUsageError("--executable and --arch go together: the arch of that Node.js binary");
}
const executable = values.executable === undefined ? process.execPath : resolve(values.executable);
const arch = values.arch ?? process.arch;
const START_FROM = ["snapshot", "code-cache", "source"];
const startFrom = values["start-from"];
if (!START_FROM.includes(startFrom)) {
  throw new BuildBinaryUsageError(`--start-from ${startFrom}: one of ${START_FROM.join(", ")}`);
}
if (arch !== process.arch && startFrom !== "source") {
  throw new BuildBinaryUsageError(
    `--arch ${arch}: a V8 ${startFrom} can only be made for this node's ${process.arch}; add --start-from source`,
  );
}
await expectElfArch(executable, arch);

const root = resolve(import.meta.dirname, "..");

/**
 * Loads the bundle in Node's snapshot builder under scripts/snapshot-check.cjs's traps; throws
 * if it reads, while loading, anything a snapshot would freeze (its output says what, and where).
 */
function checkSnapshot(bundle, scratchBlob) {
  const checked = spawnSync(
    process.execPath,
    [
      ...NODE_FLAGS,
      "--snapshot-blob",
      scratchBlob,
      "--build-snapshot",
      join(root, "scripts/snapshot-check.cjs"),
      bundle,
    ],
    { stdio: ["ignore", "inherit", "inherit"] },
  );
  if (checked.status !== 0)
    throw new Error(
      `the bundle cannot start from a snapshot: snapshot-check exited with ${checked.status ?? checked.signal}`,
    );
}
const target = resolve(values.outfile);
// Written beside the target and renamed onto it only once complete, so a failed build leaves
// neither a partial executable nor anything else next to it (removed in `finally`).
const built = `${target}.building-${process.pid}`;
const work = await mkdtemp(join(tmpdir(), "taskshim-sea-"));
await mkdir(dirname(target), { recursive: true });
try {
  const bundle = join(work, "taskshim.cjs");
  const config = join(work, "sea-config.json");
  // The executable is a copy of this node, or of --executable (below): its version, platform and
  // arch are part of what runs, so they go into the build id (scripts/build.mjs) beside the
  // bundle. --executable is of this node's version and platform (linux, as every release).
  const runtime = `node ${process.versions.node} ${process.platform}-${arch}`;
  const passOn = ["--runtime", runtime];
  if (values.version) passOn.push("--version", values.version);
  if (values["state-version"]) passOn.push("--state-version", values["state-version"]);
  try {
    execFileSync(process.execPath, [join(root, "scripts/build.mjs"), "--outfile", bundle, ...passOn], {
      stdio: "inherit",
    });
  } catch (err) {
    // Its own output (esbuild's errors) has been shown; the command line would say nothing more.
    throw new Error(`bundling failed: scripts/build.mjs exited with ${err.status ?? err.signal ?? err.code}`);
  }
  await writeFile(
    config,
    JSON.stringify({
      main: bundle,
      // The node running this script, which check-node.mjs has just confirmed is the pinned one
      // (also --build-sea's default; named so the guarantee does not rest on a default), or the
      // caller's --executable of the same version.
      executable,
      output: built,
      disableExperimentalSEAWarning: true,
      useSnapshot: startFrom === "snapshot",
      useCodeCache: startFrom === "code-cache",
      // The flags of every launch path (systemd, supervise, by hand).
      execArgv: NODE_FLAGS,
    }),
  );
  if (startFrom === "snapshot") checkSnapshot(bundle, join(work, "check.blob"));
  // Node reports success with one line, "Generated single executable <node> + <config> -> <output>":
  // not worth showing. Anything else it says (a warning, an error) is shown.
  // Under the binary's own flags: V8 rejects a code cache made under other flags (their hash is
  // part of it), with "Warning: Code cache data rejected." at every start and no cache used; a
  // snapshot is likewise made by V8 under the flags it will run with.
  const said = spawnSync(process.execPath, [...NODE_FLAGS, "--build-sea", config], { encoding: "utf8" });
  const lines = `${said.stdout}${said.stderr}`
    .split("\n")
    .filter((l) => l && !l.startsWith("Generated single executable"));
  if (lines.length > 0) console.error(lines.join("\n"));
  if (said.status !== 0) throw new Error(`node --build-sea exited with ${said.status}`);
  await chmod(built, 0o755);
  await rename(built, target);
} finally {
  await rm(work, { recursive: true, force: true });
  await rm(built, { force: true });
}
