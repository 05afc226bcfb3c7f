import { configDefaults, defineConfig } from "vitest/config";

/*
 * The unit tests as StrykerJS runs them (npm run test:mutation): only `src/**`, never the
 * docker project (its global setup force-removes test containers on the shared engine), and
 * without the HTTP fuzz: it covers nearly every runner line, so each runner mutant would pay
 * its ~10 s, and its random seed would make the score vary from run to run. Nor the
 * architecture test: it checks the folder graph and runs ESLint, and covers no mutated line.
 */
export default defineConfig({
  test: {
    include: ["src/**/*.test.ts"],
    exclude: [...configDefaults.exclude, "src/api/fuzz.test.ts", "src/architecture.test.ts"],
    testTimeout: 10_000,
  },
});
