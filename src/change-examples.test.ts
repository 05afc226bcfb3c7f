import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { buildCli } from "./cli/main.js";
import { SERVE_SETTINGS } from "./config/shim-config.js";
import { KNOWN_CONFIG_KEYS, decodeStoredConfig } from "./state/stored-config.js";
import { parseTaskConfig } from "./tasks/task-config.js";
import { TASK_FIELDS, TaskSubmitBodySchema } from "./tasks/task-fields.js";
import { taskBody } from "./testing/fixtures.js";

/*
 * docs/architecture.md, "How a change moves through the house", tells a newcomer which files a
 * change touches. Its two worked examples (a new task field, a new daemon flag) are claims about
 * the code; this file checks them: every file they name exists, every symbol they name is
 * exported by one of those files, and what they say is derived from one place really is.
 */

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const SRC = join(ROOT, "src");

/** The text of one bullet of the section (`- **A new task field.** …`), up to the next. */
function workedExample(markdown: string, title: string): string {
  const section = markdown.split("## How a change moves through the house")[1]?.split("\n## ")[0] ?? "";
  const start = section.indexOf(`- **${title}.**`);
  if (start < 0) throw new Error(`docs/architecture.md has no worked example "${title}"`);
  const end = section.indexOf("\n- **", start + 1);
  return section.slice(start, end < 0 ? undefined : end);
}

/** The code spans of a text (`…`), joined across the doc's line wraps. */
const codeSpans = (text: string): string[] =>
  [...text.replace(/\n\s*/g, " ").matchAll(/`([^`]+)`/g)].map((m) => m[1] ?? "");

/** A source file named as `folder/file.ts` (relative to src/). */
const SOURCE_PATH = /^[a-z-]+\/[\w.-]+\.ts$/;
/** A name the code exports: a type or class, a CONSTANT, or a camelCase function. */
const SYMBOL = /^(?:[A-Z][a-z]\w*|[A-Z][A-Z0-9_]+|[a-z]+[A-Z]\w*)$/;
/** TypeScript's own names a doc may use in passing. */
const BUILTINS = new Set(["Pick", "Omit", "Partial", "Record"]);

/** Whether `source` exports `name` (a declaration or an export list). */
function exportsName(source: string, name: string): boolean {
  const declared = new RegExp(
    String.raw`^export\s+(?:declare\s+)?(?:async\s+)?(?:const|let|function|class|interface|type|enum)\s+${name}\b`,
    "m",
  );
  const listed = new RegExp(String.raw`^export\s+(?:type\s+)?\{[^}]*\b${name}\b[^}]*\}`, "m");
  return declared.test(source) || listed.test(source);
}

describe("the worked examples of 'How a change moves through the house'", () => {
  const doc = (): Promise<string> => readFile(join(ROOT, "docs/architecture.md"), "utf8");

  it.each(["A new task field", "A new daemon flag"])(
    "%s: names files that exist and symbols those files export",
    async (title) => {
      const spans = codeSpans(workedExample(await doc(), title));
      const files = spans.filter((s) => SOURCE_PATH.test(s));
      expect(files.length).toBeGreaterThan(2);
      for (const file of files) expect(existsSync(join(SRC, file)), `src/${file}`).toBe(true);
      // A symbol named beside a test file may live in the file it tests.
      const sources = await Promise.all(
        [...new Set(files.map((f) => f.replace(/\.test\.ts$/, ".ts")))]
          .filter((f) => existsSync(join(SRC, f)))
          .map((f) => readFile(join(SRC, f), "utf8")),
      );
      const symbols = spans.filter((s) => SYMBOL.test(s) && !BUILTINS.has(s));
      expect(symbols.length).toBeGreaterThan(2);
      for (const symbol of symbols) {
        expect(
          sources.some((source) => exportsName(source, symbol)),
          `${symbol} is exported by none of ${files.join(", ")}`,
        ).toBe(true);
      }
    },
  );

  it("a new task field: the table is the one list of fields the wire, the parser and task.json know", () => {
    const fields = Object.keys(TASK_FIELDS);
    // The wire schema (and the OpenAPI document made from it) is derived from the table.
    expect(Object.keys(TaskSubmitBodySchema.properties)).toEqual(fields);
    // task.json's reader knows exactly the table's keys: one more entry there is known here.
    expect([...KNOWN_CONFIG_KEYS].sort()).toEqual([...fields].sort());
    // The parser's config has every field of the table but the credentials and the optional
    // ones a body leaves out, and no other.
    const { config } = parseTaskConfig(taskBody());
    const expected = Object.entries(TASK_FIELDS)
      .filter(([, f]) => !("credential" in f) && !("optional" in f))
      .map(([name]) => name);
    expect(Object.keys(config).sort()).toEqual(expect.arrayContaining(expected.sort()));
    for (const key of Object.keys(config)) expect(fields).toContain(key);
    // A config written to task.json reads back the same through the same table.
    expect(decodeStoredConfig(JSON.parse(JSON.stringify(config)))).toEqual(config);
  });

  it("a new daemon flag: one entry of SERVE_SETTINGS is a flag of both serving commands", () => {
    const cli = buildCli();
    const serve = cli.commands.find((c) => c.name() === "serve");
    expect(serve).toBeDefined();
    for (const setting of Object.values(SERVE_SETTINGS)) {
      const long = setting.flag.split(/[ ,]/)[0] ?? "";
      for (const command of [cli, serve]) {
        const option = command?.options.find((o) => o.long === long);
        expect(option, `${long} on ${command?.name() ?? "?"}`).toBeDefined();
        expect(option?.description).toContain(`[env ${setting.env}]`);
      }
    }
  });
});
