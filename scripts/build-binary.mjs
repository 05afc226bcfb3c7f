// Builds dist/taskshim: one executable that needs no Node on the host (Node's single
// executable application support: the bundle is injected into a copy of this node binary).
import { execFileSync } from "node:child_process";
import { copyFile, chmod, writeFile } from "node:fs/promises";

const run = (cmd, args) => execFileSync(cmd, args, { stdio: "inherit" });

run(process.execPath, ["scripts/build.mjs"]);
await writeFile(
  "dist/sea-config.json",
  JSON.stringify({
    main: "dist/taskshim.cjs",
    output: "dist/sea-prep.blob",
    disableExperimentalSEAWarning: true,
    useCodeCache: true,
  }),
);
run(process.execPath, ["--experimental-sea-config", "dist/sea-config.json"]);
// The blob must be injected into the same node binary that made it.
await copyFile(process.execPath, "dist/taskshim");
await chmod("dist/taskshim", 0o755);
run(process.execPath, [
  "node_modules/postject/dist/cli.js",
  "dist/taskshim",
  "NODE_SEA_BLOB",
  "dist/sea-prep.blob",
  "--sentinel-fuse",
  "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2",
]);
