/*
 * The lint rule that keeps TaskCommits the one writer of task state, run through the repo's own
 * eslint.config.js: a `store.modify` or a `persister.persist`/`persistChange` outside
 * task-commits.ts and the persister fails `npm run lint`; the modes of TaskCommits do not.
 */
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ESLint } from "eslint";
import tseslint from "typescript-eslint";
import { beforeAll, describe, expect, it } from "vitest";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

/** A runner step written by hand: what the rule is there to refuse. */
const BY_HAND = `
declare const ctx: { store: { modify(id: string, fn: (d: { exitCode?: number }) => void): unknown } };
declare const persister: { persist(id: string): Promise<void>; persistChange(id: string, fn: () => void): Promise<unknown> };
export async function step(id: string): Promise<void> {
  ctx.store.modify(id, (d) => (d.exitCode = 1));
  await persister.persist(id);
  await persister?.persistChange(id, () => undefined);
}
`;

/** A method taken off the store to call later: still refused. */
const TAKEN_OFF = `
declare const store: { modify(id: string, fn: () => void): unknown };
export const change = store.modify.bind(store);
`;

/** The same step through a mode of TaskCommits: allowed. */
const THROUGH_A_MODE = `
declare const commits: {
  commit(id: string, fn: (d: { exitCode?: number }) => void): Promise<unknown>;
  writeRestored(id: string): Promise<void>;
};
export async function step(id: string): Promise<void> {
  await commits.commit(id, (d) => (d.exitCode = 1));
  await commits.writeRestored(id);
}
`;

// Loading the config (typescript-eslint included) takes seconds on a busy machine.
describe("the single-writer lint rule", { timeout: 60_000 }, () => {
  let eslint: ESLint;
  beforeAll(() => {
    // The repo's eslint.config.js as it is, without type information: the virtual files below are
    // in no tsconfig, and this rule needs none.
    eslint = new ESLint({ cwd: ROOT, overrideConfig: tseslint.configs.disableTypeChecked });
  });

  /** The single-writer messages (and any parse failure) ESLint reports for `code` at `filePath`. */
  async function writerErrors(filePath: string, code: string): Promise<string[]> {
    const [result] = await eslint.lintText(code, { filePath: join(ROOT, filePath) });
    return (result?.messages ?? [])
      .filter((m) => m.ruleId === "no-restricted-syntax" || m.fatal)
      .map((m) => m.message);
  }

  it("refuses store.modify, persist and persistChange in a runner step, naming TaskCommits", async () => {
    const errors = await writerErrors("src/runner/task-start.ts", BY_HAND);
    expect(errors).toEqual([
      expect.stringMatching(
        /^A task changes only through a mode of TaskCommits \(src\/runner\/task-commits\.ts\)/,
      ),
      expect.stringMatching(/^task\.json is written only through a mode of TaskCommits/),
      expect.stringMatching(/^task\.json is written only through a mode of TaskCommits/),
    ]);
  });

  it("refuses them in every production folder, and a method taken off the store", async () => {
    expect(await writerErrors("src/api/task-routes.ts", BY_HAND)).toHaveLength(3);
    expect(await writerErrors("src/runner/recover.ts", TAKEN_OFF)).toEqual([
      expect.stringContaining("A task changes only through a mode of TaskCommits"),
    ]);
  });

  it("allows the modes of TaskCommits anywhere", async () => {
    expect(await writerErrors("src/runner/task-start.ts", THROUGH_A_MODE)).toEqual([]);
  });

  it("allows the writer itself, the persister, and test code", async () => {
    for (const file of [
      "src/runner/task-commits.ts",
      "src/runner/task-persister.ts",
      "src/runner/task-runner.test.ts",
      "src/testing/test-context.ts",
    ]) {
      expect({ file, errors: await writerErrors(file, BY_HAND) }).toEqual({ file, errors: [] });
    }
  });
});
