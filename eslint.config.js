import js from "@eslint/js";
import tseslint from "typescript-eslint";
import { boundaryConfigs } from "./eslint-boundaries.ts";

/** Imports refused everywhere (the boundary blocks below repeat them: a later block's options replace these). */
const restrictedPaths = [{ name: "@sinclair/typebox", message: "use 'typebox'" }];

export default tseslint.config(
  {
    ignores: [
      "dist/",
      "node_modules/",
      "coverage/",
      "bench/results/",
      "scripts/*.mjs",
      "reports/",
      ".stryker-tmp/",
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      "@typescript-eslint/switch-exhaustiveness-check": "error",
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "no-restricted-imports": ["error", { paths: restrictedPaths }],
    },
  },
  // Arrows only point down: the folder graph of docs/architecture.md, one block per folder.
  ...boundaryConfigs(restrictedPaths),
  {
    files: ["eslint.config.js"],
    extends: [tseslint.configs.disableTypeChecked],
  },
);
