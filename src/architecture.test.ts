import { readdir, readFile } from "node:fs/promises";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ESLint } from "eslint";
import tseslint from "typescript-eslint";
import { beforeAll, describe, expect, it } from "vitest";
import { FOLDER_GRAPH, SHARED_LEAVES, type GraphNode } from "../eslint-boundaries.js";

/*
 * The folder graph has three copies that must say the same: the table in eslint-boundaries.ts
 * (which the linter enforces), the graph in docs/architecture.md, and the imports the code makes.
 * This file checks them against each other and proves that the linter really refuses an upward
 * import, through the repo's own eslint.config.js. It also checks that the docs name no source
 * file that is not there, so a file moved between folders leaves no stale path in them.
 */

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const SRC = join(ROOT, "src");

/** A node's arrows as sorted lists, for comparing. */
interface Arrows {
  readonly imports: string[];
  readonly typesFrom: string[];
}

const sorted = (items: Iterable<string>): string[] => [...items].sort();

function tableArrows(): Map<GraphNode, Arrows> {
  return new Map(
    Object.entries(FOLDER_GRAPH).map(([node, e]) => [
      node,
      { imports: sorted(e.imports), typesFrom: sorted(e.typesFrom) },
    ]),
  );
}

/**
 * The graph block of docs/architecture.md: `from ──► a, b; types only: c`, `from ──► nothing`,
 * and `every folder ──► …` for the shared leaves.
 */
function parseDocGraph(markdown: string): { arrows: Map<GraphNode, Arrows>; shared: string[] } {
  const section = markdown.split("How they depend on each other")[1] ?? "";
  const block = /```text\n([\s\S]*?)```/.exec(section)?.[1];
  if (block === undefined) throw new Error("docs/architecture.md has no graph block after its heading");
  const arrows = new Map<GraphNode, Arrows>();
  let shared: string[] = [];
  for (const line of block.split("\n").filter((l) => l.trim() !== "")) {
    const match = /^(.+?) ─+► (.+)$/.exec(line);
    if (!match) throw new Error(`unreadable graph line: ${line}`);
    const [, from = "", to = ""] = match;
    const [values = "", types = ""] = to.split(/;?\s*types only: /);
    const list = (text: string) =>
      text.trim() === "nothing" || text.trim() === "" ? [] : text.split(",").map((s) => s.trim());
    if (from === "every folder") shared = sorted(list(values));
    else arrows.set(from, { imports: sorted(list(values)), typesFrom: sorted(list(types)) });
  }
  return { arrows, shared };
}

/** Production `.ts` files of src/ (test files and test doubles left out), relative to src/. */
async function productionFiles(): Promise<string[]> {
  const entries = await readdir(SRC, { recursive: true, withFileTypes: true });
  return entries
    .filter((e) => e.isFile() && e.name.endsWith(".ts"))
    .map((e) => relative(SRC, join(e.parentPath, e.name)))
    .filter(
      (path) =>
        !path.endsWith(".test.ts") &&
        !/(^|\/)(test-support|test-api|fs-journal)\.ts$/.test(path) &&
        !path.startsWith("testing/"),
    );
}

/** The node a src-relative path belongs to: its folder, or the file itself at the top. */
const nodeOf = (path: string): GraphNode => (path.includes("/") ? (path.split("/")[0] ?? path) : path);

/** The imports between nodes the code makes, per node: value arrows and type-only arrows. */
async function codeArrows(): Promise<Map<GraphNode, { values: Set<string>; types: Set<string> }>> {
  const found = new Map<GraphNode, { values: Set<string>; types: Set<string> }>();
  const statement =
    /^(?:import|export)(\s+type)?\s+([^;]*?)\s+from\s+"(\.{1,2}\/[^"]+)"|import\(\s*"(\.{1,2}\/[^"]+)"\s*\)/gm;
  for (const path of await productionFiles()) {
    const from = nodeOf(path);
    const text = await readFile(join(SRC, path), "utf8");
    for (const m of text.matchAll(statement)) {
      const specifier = m[3] ?? m[4] ?? "";
      const target = relative(SRC, resolve(SRC, dirname(path), specifier)).replace(/\.js$/, ".ts");
      if (target.startsWith("..")) continue; // package.json
      const to = nodeOf(target);
      if (to === from) continue;
      const typeOnly =
        m[1] !== undefined || /^\{(\s*type\s+[\w$]+(\s+as\s+[\w$]+)?\s*,?)+\s*\}$/.test(m[2] ?? "");
      const entry = found.get(from) ?? { values: new Set(), types: new Set() };
      (typeOnly ? entry.types : entry.values).add(to);
      found.set(from, entry);
    }
  }
  return found;
}

describe("the folder graph", () => {
  it("is the same in docs/architecture.md as in eslint-boundaries.ts", async () => {
    const doc = parseDocGraph(await readFile(join(ROOT, "docs", "architecture.md"), "utf8"));
    expect(Object.fromEntries(doc.arrows)).toEqual(Object.fromEntries(tableArrows()));
    expect(doc.shared).toEqual(sorted(SHARED_LEAVES));
  });

  it("has every folder and top-level file of src/ in it, and points only down (no cycle)", async () => {
    const nodes = (await readdir(SRC, { withFileTypes: true }))
      .filter((e) => e.isDirectory() || (e.name.endsWith(".ts") && !e.name.endsWith(".test.ts")))
      .map((e) => e.name)
      .filter((name) => name !== "testing");
    expect(sorted(nodes).filter((n) => !(n in FOLDER_GRAPH))).toEqual([]);
    // Each node may only import nodes listed after it: the table's order is the layering.
    const order = Object.keys(FOLDER_GRAPH);
    const upward = order.flatMap((from, i) =>
      [...(FOLDER_GRAPH[from]?.imports ?? []), ...(FOLDER_GRAPH[from]?.typesFrom ?? [])]
        .filter((to) => order.indexOf(to) <= i)
        .map((to) => `${from} → ${to}`),
    );
    expect(upward).toEqual([]);
    expect(SHARED_LEAVES.flatMap((leaf) => FOLDER_GRAPH[leaf]?.imports ?? ["missing"])).toEqual([]);
  });

  it("has exactly the arrows the code uses: none missing, none stale, types-only ones used for types only", async () => {
    const code = await codeArrows();
    const problems: string[] = [];
    for (const [from, allowed] of tableArrows()) {
      const used = code.get(from) ?? { values: new Set<string>(), types: new Set<string>() };
      for (const to of used.values) {
        if (!allowed.imports.includes(to) && !SHARED_LEAVES.includes(to))
          problems.push(`${from} imports values from ${to}`);
      }
      for (const to of used.types) {
        if (![...allowed.imports, ...allowed.typesFrom, ...SHARED_LEAVES].includes(to))
          problems.push(`${from} imports types from ${to}`);
      }
      for (const to of [...allowed.imports, ...allowed.typesFrom]) {
        if (!used.values.has(to) && !used.types.has(to))
          problems.push(`stale arrow ${from} → ${to}: nothing imports it`);
      }
    }
    for (const from of code.keys()) if (!(from in FOLDER_GRAPH)) problems.push(`${from} is not in the graph`);
    expect(problems).toEqual([]);
  });
});

describe("the files", () => {
  /** The most lines a production file has before its header must say why it is not split. */
  const MAX_LINES = 450;

  it(`are at most ${MAX_LINES} lines, or say in their header why not`, async () => {
    const long: string[] = [];
    for (const path of await productionFiles()) {
      const lines = (await readFile(join(SRC, path), "utf8")).split("\n");
      // The header: the comments before the first declaration, where a file says what it holds.
      const header = lines.slice(0, 40).join("\n");
      if (lines.length > MAX_LINES && !/longer than 450 lines because/i.test(header))
        long.push(`${path}: ${lines.length} lines`);
    }
    expect(long).toEqual([]);
  });
});

describe("the docs", () => {
  /** Every file of the repo (dependencies, build output and git aside), relative to its root. */
  async function repoFiles(): Promise<Set<string>> {
    const skip = /^(node_modules|dist|coverage|reports|\.git|\.stryker-tmp)(\/|$)/;
    const entries = await readdir(ROOT, { recursive: true, withFileTypes: true });
    return new Set(
      entries
        .filter((e) => e.isFile())
        .map((e) => relative(ROOT, join(e.parentPath, e.name)))
        .filter((path) => !skip.test(path)),
    );
  }

  it("name only TypeScript files that exist: a moved or renamed file leaves no stale path behind", async () => {
    const files = await repoFiles();
    const names = new Set([...files].map((path) => path.split("/").at(-1) ?? path));
    const stale: string[] = [];
    for (const doc of [
      "README.md",
      "TESTING.md",
      "docs/architecture.md",
      "docs/operations.md",
      "docs/api.md",
      "docs/fault-matrix.md",
    ]) {
      const text = await readFile(join(ROOT, doc), "utf8");
      // `src/shim/serve-flags.ts`, `shim/serve-flags.ts` (under src/), or a bare `serve-flags.ts`.
      for (const [, path = ""] of text.matchAll(/`((?:[a-z][\w.-]*\/)*[a-z][\w.-]*\.ts)`/g)) {
        const found = path.includes("/") ? files.has(path) || files.has(`src/${path}`) : names.has(path);
        if (!found) stale.push(`${doc}: ${path}`);
      }
    }
    expect(stale).toEqual([]);
  });
});

describe("npm run lint", () => {
  let eslint: ESLint;
  beforeAll(() => {
    // The repo's eslint.config.js as it is, without type information: the virtual files below are
    // in no tsconfig, and the boundary rule needs none.
    eslint = new ESLint({ cwd: ROOT, overrideConfig: tseslint.configs.disableTypeChecked });
  });

  /** The boundary messages ESLint reports for `code` as if it were the file at `filePath`. */
  async function boundaryErrors(filePath: string, code: string): Promise<string[]> {
    const [result] = await eslint.lintText(code, { filePath: join(ROOT, filePath) });
    return (result?.messages ?? [])
      .filter((m) => m.ruleId === "no-restricted-imports" || m.fatal)
      .map((m) => m.message);
  }

  it("fails on an upward import (tasks → docker: the domain imports nothing) and names the rule's source", async () => {
    const errors = await boundaryErrors(
      "src/tasks/upward.ts",
      'import { LABEL_TASK_ID } from "../docker/docker-client.js";\nexport const label = LABEL_TASK_ID;\n',
    );
    expect(errors).toHaveLength(1);
    expect(errors[0]).toContain("src/docker is above or beside src/tasks");
    expect(errors[0]).toContain("src/tasks may import errors, version.ts");
  });

  it("passes the same folder's allowed imports", async () => {
    expect(
      await boundaryErrors(
        "src/docker/downward.ts",
        'import { OperationBound } from "../exec/operation-bound.js";\nimport type { GpuContainerConfig } from "../host/gpu-inventory.js";\nexport const b = OperationBound;\nexport type G = GpuContainerConfig;\n',
      ),
    ).toEqual([]);
  });

  it("lets docker import only types from host", async () => {
    const errors = await boundaryErrors(
      "src/docker/value.ts",
      'import { loadGpuFixture } from "../host/gpu-inventory.js";\nexport const d = loadGpuFixture;\n',
    );
    expect(errors).toEqual([expect.stringContaining("src/docker may import only types from src/host")]);
  });

  it("refuses a folder the graph does not know, and test doubles in production code", async () => {
    expect(await boundaryErrors("src/tasks/x.ts", 'export { y } from "../newfolder/y.js";\n')).toEqual([
      expect.stringContaining("not in the folder graph"),
    ]);
    expect(await boundaryErrors("src/runner/x.ts", 'export { f } from "./test-support.js";\n')).toEqual([
      expect.stringContaining("no test double"),
    ]);
    expect(await boundaryErrors("src/main.ts", 'export { r } from "./runner/task-runner.js";\n')).toEqual([
      expect.stringContaining("src/runner is above or beside src/main.ts"),
    ]);
  });

  it("lets a test import what its folder stands on and test doubles, nothing above", async () => {
    const test = "src/state/x.test.ts";
    expect(await boundaryErrors(test, 'export { s } from "../tasks/task-store.js";\n')).toEqual([]);
    expect(await boundaryErrors(test, 'export { a } from "../host/authorized-keys.js";\n')).toEqual([
      expect.stringContaining("src/host is above or beside src/state"),
    ]);
    expect(await boundaryErrors(test, 'export { t } from "../runner/test-support.js";\n')).toEqual([]);
    expect(await boundaryErrors(test, 'export { f } from "../testing/fake.js";\n')).toEqual([]);
    expect(await boundaryErrors(test, 'export { r } from "../runner/task-runner.js";\n')).toEqual([
      expect.stringContaining("src/runner is above or beside src/state"),
    ]);
  });
});
