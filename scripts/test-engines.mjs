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
import { chmodSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
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

/**
 * Runs one project with a TMPDIR of its own, removed when it exits: the tests' homes, built
 * releases and images (~75 dirs, ~730 MB a run) go with it even when a test cannot clean up.
 * Not a sweep of /tmp by prefix: the two projects run side by side and would remove each
 * other's dirs.
 * @param {string} project @param {boolean} hold
 */
function run(project, hold) {
  const tmp = mkdtempSync(join(tmpdir(), `taskshim-tests-${project}-`));
  // Like /tmp itself: the tests' host users (useradd) must reach what the tests make there.
  chmodSync(tmp, 0o1777);
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [vitest, "run", "--project", project, ...vitestArgs], {
      cwd: root,
      env: { ...process.env, TMPDIR: tmp },
      stdio: hold ? ["ignore", "pipe", "pipe"] : "inherit",
    });
    /** @type {Buffer[]} */
    const output = [];
    child.stdout?.on("data", (chunk) => output.push(chunk));
    child.stderr?.on("data", (chunk) => output.push(chunk));
    child.once("close", (code, signal) => {
      const took = seconds();
      removeTmp(tmp);
      resolve({ project, code: code ?? 1, signal, output: Buffer.concat(output), took });
    });
  });
}

/**
 * Removes a project's TMPDIR, unless something is still mounted in it (a test's loop mount or
 * tmpfs left behind): a recursive removal would descend into it, so that is left with a warning.
 * @param {string} tmp
 */
function removeTmp(tmp) {
  const mounted = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((line) => line.split(" ")[4] ?? "")
    .filter((point) => point.startsWith(`${tmp}/`));
  if (mounted.length > 0) {
    console.error(`test-engines: warning: ${tmp} kept: still mounted there: ${mounted.join(", ")}`);
    return;
  }
  try {
    rmSync(tmp, { recursive: true, force: true });
  } catch (error) {
    console.error(`test-engines: warning: ${tmp} not removed: ${error}`);
  }
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
