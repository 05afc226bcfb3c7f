#!/usr/bin/env node
// The integration tests on both engines at once: the vitest projects `docker` and `podman`, each
// in its own vitest process (one process runs its projects one after the other), started
// together. Two engines, so they do not share containers; the podman project's output is held
// and printed after the docker project's, so neither interleaves with the other.
//
// Podman is brought up first (`ensure-engine.mjs --engine podman`). When that fails, CI=true
// fails the run (an engine that cannot be set up is an error there, as for Docker); elsewhere
// the docker project runs alone, with a warning.
//
// Usage (from `npm test`, after ensure-engine and the build): node scripts/test-engines.mjs
// [vitest arguments…], e.g. `test/pull.test.ts` for one file on both engines.
// No dependencies on purpose, like ensure-engine.mjs.

import { spawn, spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const vitest = join(root, "node_modules", "vitest", "vitest.mjs");
const ci = process.env.CI === "true";
const vitestArgs = process.argv.slice(2);

const podman = spawnSync(
  process.execPath,
  [join(root, "scripts", "ensure-engine.mjs"), "--engine", "podman"],
  {
    stdio: "inherit",
  },
);
const withPodman = podman.status === 0;
if (!withPodman) {
  if (ci) {
    console.error("test-engines: error: Podman could not be set up (CI=true: that fails the run)");
    process.exit(1);
  }
  console.error("test-engines: warning: Podman could not be set up; the podman project is skipped");
}

const started = Date.now();
const seconds = () => ((Date.now() - started) / 1000).toFixed(0);

/** @param {string} project @param {boolean} hold */
function run(project, hold) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [vitest, "run", "--project", project, ...vitestArgs], {
      cwd: root,
      stdio: hold ? ["ignore", "pipe", "pipe"] : "inherit",
    });
    /** @type {Buffer[]} */
    const output = [];
    child.stdout?.on("data", (chunk) => output.push(chunk));
    child.stderr?.on("data", (chunk) => output.push(chunk));
    child.once("close", (code, signal) => {
      const took = seconds();
      resolve({ project, code: code ?? 1, signal, output: Buffer.concat(output), took });
    });
  });
}

const runs = [run("docker", false), ...(withPodman ? [run("podman", true)] : [])];
const results = await Promise.all(runs);
for (const result of results) {
  if (result.output.length > 0) {
    console.log(`\n──── the ${result.project} project (finished after ${result.took} s) ────\n`);
    process.stdout.write(result.output);
  }
}
for (const result of results) {
  const how = result.signal ? `killed by ${result.signal}` : `exit ${result.code}`;
  console.log(`test-engines: ${result.project} project: ${how}, ${result.took} s`);
}
process.exit(results.some((r) => r.code !== 0) ? 1 : 0);
