// Bundles the shim into one CommonJS file (Node 20 SEA accepts only CommonJS).
import { build } from "esbuild";
import { chmod } from "node:fs/promises";

await build({
  entryPoints: ["src/main.ts"],
  outfile: "dist/taskshim.cjs",
  bundle: true,
  platform: "node",
  target: "node20",
  format: "cjs",
  // ssh2 (via dockerode) requires optional native addons inside try/catch.
  external: ["*.node", "cpu-features"],
  banner: { js: "#!/usr/bin/env node" },
  legalComments: "none",
  logLevel: "warning",
});
await chmod("dist/taskshim.cjs", 0o755);
