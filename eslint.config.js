import js from "@eslint/js";
import tseslint from "typescript-eslint";
import { boundaryConfigs, TEST_FILES } from "./eslint-boundaries.ts";

/**
 * The one writer of task state: a stored task changes (`store.modify`) and its task.json is
 * written (`persister.persist`, `persistChange`) only in `TaskCommits`, whose named modes fix the
 * order of memory and disk that a crash must find; the persister and tests (which seed and spy
 * on the store) aside. Any access is refused, not only a call: a method taken off the object
 * would be a call the rule could not see. src/runner/single-writer.test.ts proves it.
 */
const SINGLE_WRITER_FILES = ["src/runner/task-commits.ts", "src/runner/task-persister.ts"];
const singleWriter = (method, what) => ({
  selector: `MemberExpression[computed=false][property.name='${method}']`,
  message: `${what} only through a mode of TaskCommits (src/runner/task-commits.ts): it alone orders memory and task.json for a crash.`,
});

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
      "scripts/*.cjs",
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
    name: "taskshim/single-writer",
    files: ["src/**/*.ts"],
    ignores: [...SINGLE_WRITER_FILES, ...TEST_FILES],
    rules: {
      "no-restricted-syntax": [
        "error",
        singleWriter("modify", "A task changes"),
        singleWriter("persist", "task.json is written"),
        singleWriter("persistChange", "task.json is written"),
      ],
    },
  },
  {
    files: ["eslint.config.js"],
    extends: [tseslint.configs.disableTypeChecked],
  },
);
