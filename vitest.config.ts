import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: "unit",
          include: ["src/**/*.test.ts"],
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
    ],
  },
});
