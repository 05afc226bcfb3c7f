/*
 * The folder graph of src/: which folder may import which. eslint.config.js turns it into
 * `no-restricted-imports` rules (a wrong import fails `npm run lint`), and
 * src/architecture.test.ts checks it against the graph in docs/architecture.md and against the
 * imports the code really makes. Change an arrow here, in the doc, and in the code together.
 *
 * Plain, erasable TypeScript with no imports: Node runs it as it is when eslint.config.js loads it.
 */

/** A folder of src/ (`docker`), or a file directly in it (`main.ts`). */
export type GraphNode = string;

/** What a node may import from the other nodes (its own files are always fine). */
export interface NodeImports {
  /** Nodes it may import values and types from. */
  readonly imports: readonly GraphNode[];
  /** Nodes it may import only types from (`import type …`). */
  readonly typesFrom: readonly GraphNode[];
}

const edges = (imports: readonly GraphNode[], typesFrom: readonly GraphNode[] = []): NodeImports => ({
  imports,
  typesFrom,
});

/**
 * The arrows, top to bottom (docs/architecture.md, "How they depend on each other"). Every arrow
 * is an import the code makes today; a node lower in the list never imports one higher up.
 */
export const FOLDER_GRAPH: Readonly<Record<GraphNode, NodeImports>> = {
  "main.ts": edges(["cli"]),
  // The `taskshim` command: the client commands, and the commander wiring that calls into shim/.
  cli: edges(["config", "control", "docker", "exec", "host", "shim", "tasks"]),
  // The daemon: the process that serves (composition, start, shutdown), supervise, the socket.
  shim: edges([
    "api",
    "components",
    "config",
    "dcgm",
    "docker",
    "exec",
    "host",
    "lifecycle",
    "runner",
    "state",
    "tasks",
  ]),
  control: edges(["docker", "exec", "tasks", "wire"]),
  api: edges(["components", "dcgm", "docker", "host", "lifecycle", "runner", "state", "tasks", "wire"]),
  // The HTTP wire format: the schemas api/ serves and control/ reads answers with.
  wire: edges(["lifecycle", "tasks"]),
  config: edges(["docker", "host"]),
  components: edges(["exec", "logging", "state"]),
  // DCGM: the exporter the shim supervises and the GPU health it reads, behind ports api/ uses.
  dcgm: edges(["exec", "state"]),
  runner: edges(["docker", "exec", "host", "logging", "state", "tasks"]),
  state: edges(["tasks"]),
  // The Docker layer reads the host's GPU types to build device requests; it calls nothing there.
  docker: edges(["exec", "tasks"], ["host"]),
  host: edges(["exec", "tasks"]),
  // The domain at the bottom: the task model, its config and the values adapters fill in.
  tasks: edges([]),
  logging: edges([]),
  // The shim process's own phases (starting … stopped) and its shutdown deadline: shim drives
  // them, api and wire show the phase.
  lifecycle: edges([]),
  exec: edges([]),
  errors: edges([]),
  "version.ts": edges([]),
};

/** Leaves every node may import (error helpers, the version constant); they import no node. */
export const SHARED_LEAVES: readonly GraphNode[] = ["errors", "version.ts"];

/**
 * Test code may import what its folder stands on, directly or further down, and test doubles:
 * a `test-support.ts` file, anything in src/testing/ or test/support/. These files are test
 * code too, and production code may import none of them.
 */
export const TEST_FILES: readonly string[] = [
  "src/**/*.test.ts",
  "src/**/test-support.ts",
  "src/**/test-api.ts",
  "src/**/fs-journal.ts",
  "src/testing/**/*.ts",
];
const TEST_SUPPORT_FOLDERS = ["testing"];
const TEST_SUPPORT_FILE = "test-support\\.js";

/** Every node a node reaches through its arrows (values or types), the shared leaves included. */
export function reachableFrom(node: GraphNode): Set<GraphNode> {
  const seen = new Set<GraphNode>(SHARED_LEAVES);
  const stack = [node];
  while (stack.length > 0) {
    const next = FOLDER_GRAPH[stack.pop() ?? ""];
    for (const target of [...(next?.imports ?? []), ...(next?.typesFrom ?? [])]) {
      if (!seen.has(target)) {
        seen.add(target);
        stack.push(target);
      }
    }
  }
  seen.delete(node);
  return seen;
}

const escape = (text: string): string => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const isFile = (node: GraphNode): boolean => node.endsWith(".ts");
const folders = (): GraphNode[] => Object.keys(FOLDER_GRAPH).filter((node) => !isFile(node));

/**
 * The start of an import specifier that reaches `node` from a file in `from`: `../docker/`,
 * `../version.js`, or `./cli/` from a file directly in src/.
 */
function specifierPattern(from: GraphNode, node: GraphNode, suffix = ""): string {
  const up = isFile(from) ? "\\./" : "\\.\\./";
  return isFile(node)
    ? `^${up}${escape(node.replace(/\.ts$/, ""))}(?:\\.js)?$`
    : `^${up}${escape(node)}/${suffix}`;
}

/** The message of a broken arrow: what is wrong, what is allowed instead, and where the rule lives. */
function message(
  from: GraphNode,
  allowed: Iterable<GraphNode>,
  typesOnly: Iterable<GraphNode>,
  what: string,
): string {
  const list = [...allowed].sort().join(", ") || "nothing";
  const types = [...typesOnly].sort().join(", ");
  return `${what}: src/${from} may import ${list}${types ? `; types only: ${types}` : ""} (docs/architecture.md, eslint-boundaries.ts).`;
}

interface RestrictedPattern {
  readonly regex: string;
  readonly message: string;
  readonly allowTypeImports?: boolean;
}

/** The `no-restricted-imports` patterns for production files (`test` false) or test files of a node. */
export function restrictedPatterns(from: GraphNode, test: boolean): RestrictedPattern[] {
  const own = FOLDER_GRAPH[from];
  if (own === undefined) throw new Error(`${from} is not in FOLDER_GRAPH`);
  // A shared leaf imports no node, not even the other leaf.
  const shared = SHARED_LEAVES.includes(from) ? [] : SHARED_LEAVES;
  const allowed = test ? reachableFrom(from) : new Set([...own.imports, ...shared]);
  const typesOnly = test ? new Set<GraphNode>() : new Set(own.typesFrom);
  const patterns: RestrictedPattern[] = [];
  for (const node of Object.keys(FOLDER_GRAPH)) {
    if (node === from || allowed.has(node)) continue;
    if (typesOnly.has(node)) {
      patterns.push({
        regex: specifierPattern(from, node),
        allowTypeImports: true,
        message: message(from, allowed, typesOnly, `src/${from} may import only types from src/${node}`),
      });
      continue;
    }
    // Test code may still take a test double from a folder it does not stand on.
    const suffix = test && !isFile(node) ? `(?!${TEST_SUPPORT_FILE}$)` : "";
    patterns.push({
      regex: specifierPattern(from, node, suffix),
      message: message(from, allowed, typesOnly, `src/${node} is above or beside src/${from}`),
    });
  }
  // A folder the graph does not know is refused until it has its place in the graph.
  const known = [...folders(), ...(test ? TEST_SUPPORT_FOLDERS : [])].map(escape).join("|");
  const up = isFile(from) ? "\\./" : "\\.\\./";
  patterns.push({
    regex: `^${up}(?!(?:${known})/)[^./][^/]*/`,
    message: `a folder of src/ that is not in the folder graph (eslint-boundaries.ts, docs/architecture.md).`,
  });
  if (!test) {
    patterns.push({
      regex: `(?:^|/)(?:${TEST_SUPPORT_FILE}|test-api\\.js|fs-journal\\.js)$|^(?:\\.\\./)+test/|/testing/`,
      message: "production code imports no test double (src/testing/, test/support/, test-support.ts).",
    });
  }
  return patterns;
}

/** One flat-config block (the fields ESLint's `Linter.Config` has that these use). */
export interface BoundaryConfig {
  readonly name: string;
  /** Globs; a nested list matches a file that every glob in it matches. */
  readonly files: readonly (string | readonly string[])[];
  readonly ignores?: readonly string[];
  readonly rules: Record<string, unknown>;
}

/**
 * The flat-config blocks of the boundary rules: per node one for its production files and, for a
 * folder, one for its test files. `baseRestrictions` are the `paths` of the project-wide
 * `no-restricted-imports`, repeated here because a later block replaces a rule's options instead
 * of merging them.
 */
export function boundaryConfigs(baseRestrictions: readonly object[]): BoundaryConfig[] {
  const rule = (node: GraphNode, test: boolean) => ({
    "no-restricted-imports": ["error", { paths: baseRestrictions, patterns: restrictedPatterns(node, test) }],
  });
  return Object.keys(FOLDER_GRAPH).flatMap((node): BoundaryConfig[] => {
    if (isFile(node))
      return [{ name: `taskshim/boundaries/${node}`, files: [`src/${node}`], rules: rule(node, false) }];
    const inFolder = `src/${node}/**/*.ts`;
    return [
      {
        name: `taskshim/boundaries/${node}`,
        files: [inFolder],
        ignores: [...TEST_FILES],
        rules: rule(node, false),
      },
      // A nested array matches a file that every glob in it matches: this folder's test files.
      {
        name: `taskshim/boundaries/${node}/tests`,
        files: TEST_FILES.map((glob) => [inFolder, glob]),
        rules: rule(node, true),
      },
    ];
  });
}
