import { removeTestContainers, testDocker } from "./docker.js";
import { ensureTestImages, removeUniqueImages } from "./images.js";

const PING_TIMEOUT_MS = 5_000;

/**
 * Vitest globalSetup of the `docker` project: requires a reachable engine (these tests never skip;
 * `npm test` runs `scripts/ensure-engine.mjs` first), builds the local test images, and returns a
 * teardown that removes the test containers and throwaway images.
 */
export default async function setup(): Promise<() => Promise<void>> {
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
