import { defineConfig } from "vitest/config";

/** Podman's Docker-compatible socket, started by `node scripts/ensure-engine.mjs --engine podman`. */
const PODMAN_DOCKER_HOST = "unix:///run/taskshim-podman/podman.sock";

/**
 * The integration files that also run on Podman: together they make every Engine API call the
 * shim makes (TESTING.md, "Two engines", says why these and not the others).
 */
const PODMAN_FILES = [
  "test/lifecycle.test.ts",
  "test/serve.test.ts",
  "test/chaos.test.ts",
  "test/ownership.test.ts",
  "test/pull.test.ts",
  "test/fence.test.ts",
  "test/removal.test.ts",
];

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: "unit",
          include: ["src/**/*.test.ts", "bench/**/*.test.ts"],
          testTimeout: 10_000,
        },
      },
      {
        test: {
          name: "docker",
          include: ["test/**/*.test.ts"],
          // One engine, one host: integration files share dockerd, ports and the registry.
          fileParallelism: false,
          testTimeout: 120_000,
          hookTimeout: 180_000,
          globalSetup: ["test/support/global-setup.ts"],
        },
      },
      {
        test: {
          name: "podman",
          include: PODMAN_FILES,
          fileParallelism: false,
          testTimeout: 120_000,
          hookTimeout: 180_000,
          // Every test client and every shim the tests spawn finds its engine through DOCKER_HOST.
          env: { DOCKER_HOST: PODMAN_DOCKER_HOST, TASKSHIM_TEST_ENGINE: "podman" },
          globalSetup: ["test/support/global-setup.ts"],
        },
      },
    ],
  },
});
