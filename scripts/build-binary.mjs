// Builds dist/taskshim: one executable that needs no Node on the host (Node's single executable
// application support: `node --build-sea` writes the bundle as a blob into a copy of this very
// node binary, the pinned Node.js of package.json, so the blob always comes from the same version
// as the executable that reads it).
// Test builds may override the output, the version and the state-file format:
//   node scripts/build-binary.mjs [--outfile F] [--version X.Y.Z] [--state-version N] [--no-code-cache]
import { execFileSync, spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { parseArgs } from "node:util";
import "./check-node.mjs";
import { NODE_FLAGS } from "./node-flags.mjs";

const { values } = parseArgs({
  options: {
    outfile: { type: "string", default: "dist/taskshim" },
    version: { type: "string" },
    "state-version": { type: "string" },
    // V8's code cache of the bundle is embedded unless this is given (only to measure its effect:
    // `taskshim --version` starts in 165 ms with it against 305 ms without, BENCHMARKS.md).
    "no-code-cache": { type: "boolean", default: false },
  },
});

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
  // The executable is a copy of this node (below): its version, platform and arch are part of
  // what runs, so they go into the build id (scripts/build.mjs) beside the bundle.
  const runtime = `node ${process.versions.node} ${process.platform}-${process.arch}`;
  const passOn = ["--runtime", runtime];
  if (values.version) passOn.push("--version", values.version);
  if (values["state-version"]) passOn.push("--state-version", values["state-version"]);
  execFileSync(process.execPath, [join(root, "scripts/build.mjs"), "--outfile", bundle, ...passOn], {
    stdio: "inherit",
  });
  await writeFile(
    config,
    JSON.stringify({
      main: bundle,
      // The node running this script, which check-node.mjs has just confirmed is the pinned one
      // (also --build-sea's default; named so the guarantee does not rest on a default).
      executable: process.execPath,
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
