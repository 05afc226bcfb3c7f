// Bundles the shim into one CommonJS file (Node 20 SEA accepts only CommonJS).
// Test builds may override the version and the state-file format:
//   node scripts/build.mjs [--outfile F] [--version X.Y.Z] [--state-version N]
import { build } from "esbuild";
import { chmod } from "node:fs/promises";
import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    outfile: { type: "string", default: "dist/taskshim.cjs" },
    version: { type: "string" },
    "state-version": { type: "string" },
  },
});

// ssh2 (via dockerode) requires optional native addons inside try/catch. Stubbing them with a
// module that throws keeps that fallback, and leaves the bundle with no require() from disk
// (which a single executable cannot do).
const stubNativeAddons = {
  name: "stub-native-addons",
  setup(b) {
    b.onResolve({ filter: /^cpu-features$|\.node$/ }, (args) => ({
      path: args.path,
      namespace: "native-stub",
    }));
    b.onLoad({ filter: /.*/, namespace: "native-stub" }, () => ({
      contents: 'throw new Error("native addon not bundled");',
      loader: "js",
    }));
  },
};

const define = {};
if (values.version) define.__TASKSHIM_VERSION__ = JSON.stringify(values.version);
if (values["state-version"]) define.__TASKSHIM_STATE_VERSION__ = String(Number(values["state-version"]));

await build({
  entryPoints: ["src/main.ts"],
  outfile: values.outfile,
  bundle: true,
  platform: "node",
  target: "node20",
  format: "cjs",
  define,
  plugins: [stubNativeAddons],
  banner: { js: "#!/usr/bin/env node" },
  legalComments: "none",
  logLevel: "warning",
});
await chmod(values.outfile, 0o755);
