// Builds dist/taskshim: one executable that needs no Node on the host (Node's single executable
// application support: `node --build-sea` writes the bundle as a blob into a copy of this very
// node binary, the pinned Node.js of package.json, so the blob always comes from the same version
// as the executable that reads it).
// Test builds may override the output, the version and the state-file format; a release's arm64
// binary (scripts/release-artifacts.mjs) names another Node.js to inject into:
//   node scripts/build-binary.mjs [--outfile F] [--version X.Y.Z] [--state-version N] [--no-code-cache]
//                                 [--executable NODE --arch ARCH]
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
    // V8's code cache of the bundle is embedded unless this is given (only to measure its effect:
    // `taskshim --version` starts in 165 ms with it against 305 ms without, BENCHMARKS.md).
    "no-code-cache": { type: "boolean", default: false },
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
// V8 makes the code cache by compiling the bundle in this process: for this arch only.
if (arch !== process.arch && !values["no-code-cache"]) {
  throw new BuildBinaryUsageError(
    `--arch ${arch}: a V8 code cache can only be made for this node's ${process.arch}; add --no-code-cache`,
  );
}
await expectElfArch(executable, arch);

const root = resolve(import.meta.dirname, "..");
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
      useCodeCache: !values["no-code-cache"],
      // The flags of every launch path (systemd, supervise, by hand).
      execArgv: NODE_FLAGS,
    }),
  );
  // Node reports success with one line, "Generated single executable <node> + <config> -> <output>":
  // not worth showing. Anything else it says (a warning, an error) is shown.
  // Under the binary's own flags: V8 rejects a code cache made under other flags (their hash is
  // part of it), with "Warning: Code cache data rejected." at every start and no cache used.
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
