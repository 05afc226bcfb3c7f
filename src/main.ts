import { EXIT_CONFIG, main } from "./cli/main.js";
import { unsupportedRuntime } from "./cli/runtime-check.js";

// One line, not a stack trace from deep inside the bundle, on a node outside `engines`.
const unsupported = unsupportedRuntime();
if (unsupported === undefined) main();
else {
  process.stderr.write(`${unsupported}\n`);
  process.exitCode = EXIT_CONFIG;
}
