import { startupSnapshot } from "node:v8";
import { EXIT_CONFIG, main } from "./cli/main.js";
import { unsupportedRuntime } from "./cli/runtime-check.js";

/** Runs the command line; one line, not a stack trace from deep inside the bundle, on a node outside `engines`. */
function run(): void {
  const unsupported = unsupportedRuntime();
  if (unsupported === undefined) main();
  else {
    process.stderr.write(`${unsupported}\n`);
    process.exitCode = EXIT_CONFIG;
  }
}

// Building the single binary's startup snapshot (scripts/build-binary.mjs) loads the bundle at
// build time: the command line runs when the snapshot is deserialized, at each start. The
// server's modules (loaded by `serve` on demand, src/shim/commands.ts) stay out of it: they load
// node:http, node:async_hooks, node:worker_threads and more at their top level, which Node either
// cannot hold in a user snapshot or does not vouch for.
if (startupSnapshot.isBuildingSnapshot()) startupSnapshot.setDeserializeMainFunction(run);
else run();
