// Builds dist/taskshim: one executable that needs no Node on the host (Node's single executable
// application support: the bundle, prepared as a blob by this very node, is injected into a copy
// of this node binary, the pinned Node.js of package.json; the blob must come from the same
// version as the executable that reads it).
// Test builds may override the output, the version and the state-file format:
//   node scripts/build-binary.mjs [--outfile F] [--version X.Y.Z] [--state-version N] [--no-code-cache]
import { execFileSync, spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { parseArgs } from "node:util";
import "./check-node.mjs";
import { injectSeaBlobFile } from "./sea-inject.mjs";

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
const work = await mkdtemp(join(tmpdir(), "taskshim-sea-"));
try {
  const bundle = join(work, "taskshim.cjs");
  const blob = join(work, "sea-prep.blob");
  const config = join(work, "sea-config.json");
  const passOn = [];
  if (values.version) passOn.push("--version", values.version);
  if (values["state-version"]) passOn.push("--state-version", values["state-version"]);
  execFileSync(process.execPath, [join(root, "scripts/build.mjs"), "--outfile", bundle, ...passOn], {
    stdio: "inherit",
  });
  await writeFile(
    config,
    JSON.stringify({
      main: bundle,
      output: blob,
      disableExperimentalSEAWarning: true,
      useCodeCache: !values["no-code-cache"],
      // The young-generation cap in every launch path (systemd, supervise, by hand): V8 grows it
      // to 16 MB x 3 after a burst of requests and keeps it, a third of the shim's memory.
      execArgv: ["--max-semi-space-size=2"],
    }),
  );
  // Node reports success with one line, "Wrote single executable preparation blob to <temp
  // path>": not worth showing. Anything else it says (a warning, an error) is shown.
  const said = spawnSync(process.execPath, ["--experimental-sea-config", config], { encoding: "utf8" });
  const lines = `${said.stdout}${said.stderr}`
    .split("\n")
    .filter((l) => l && !l.startsWith("Wrote single executable"));
  if (lines.length > 0) console.error(lines.join("\n"));
  if (said.status !== 0) throw new Error(`node --experimental-sea-config exited with ${said.status}`);
  await mkdir(dirname(resolve(values.outfile)), { recursive: true });
  await injectSeaBlobFile(process.execPath, blob, values.outfile);
  await chmod(values.outfile, 0o755);
} finally {
  await rm(work, { recursive: true, force: true });
}
