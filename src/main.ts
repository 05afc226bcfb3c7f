import { startupSnapshot } from "node:v8";
import type { Command } from "@commander-js/extra-typings";
import { buildCli, EXIT_CONFIG, main } from "./cli/main.js";
import { unsupportedRuntime } from "./cli/runtime-check.js";

/**
 * Runs the command line (`program`, built by `buildCli`); one line, not a stack trace from deep
 * inside the bundle, on a node outside `engines`.
 */
function run(program?: Command): void {
  const unsupported = unsupportedRuntime();
  if (unsupported === undefined) main(process.argv, program);
  else {
    process.stderr.write(`${unsupported}\n`);
    process.exitCode = EXIT_CONFIG;
  }
}

// Building the single binary's startup snapshot (scripts/build-binary.mjs) loads the bundle at
// build time: the command line runs when the snapshot is deserialized, at each start. Its
// commands and options are built here, at build time (nothing of them reads the host; the
// snapshot check would fail the build if they did), so a start only parses its arguments. The
// server's modules (loaded by `serve` on demand, src/shim/commands.ts) stay out of it: they load
// node:http, node:async_hooks, node:worker_threads and more at their top level, which Node either
// cannot hold in a user snapshot or does not vouch for.
if (startupSnapshot.isBuildingSnapshot()) {
  const program = buildCli();
  startupSnapshot.setDeserializeMainFunction(() => run(program));
} else run();
