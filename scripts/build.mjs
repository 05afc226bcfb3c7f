// Bundles the shim into one CommonJS file (the single binary's main script, scripts/build-binary.mjs).
// Test builds may override the version and the state-file format:
//   node scripts/build.mjs [--outfile F] [--version X.Y.Z] [--state-version N] [--runtime R]
//
// Every bundle carries its build identity (src/version.ts, BUILD):
// - commit: `git rev-parse HEAD` of this checkout, "unknown" outside one (or without git);
// - dirty: whether `git status --porcelain --untracked-files=no` lists anything, i.e. whether a
//   tracked file differs from that commit. Untracked files are not counted, as with
//   `git describe --dirty`: a scratch file would otherwise mark every build of a shared tree, and
//   the build id below already tells apart builds whose bundled code differs;
// - build_id: the first 20 hex digits of the sha256 of the bundle itself. The bundle is made with
//   a placeholder of the same length where the id goes, hashed, and the placeholder replaced by
//   the hash. So two builds of different code (another version, state format, dependency, commit
//   or dirty flag: all of them are in the bundle) never share an id, and two identical builds do.
//   --runtime names what will run the bundle when that is fixed at build time (the single
//   binary's embedded Node.js, scripts/build-binary.mjs): it is hashed too, so that a binary
//   rebuilt on another Node.js gets another id although its bundle is the same.
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { build } from "esbuild";
import { chmod, mkdir, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import { LAUNCH_ENV, NODE_FLAGS } from "./node-flags.mjs";

const { values } = parseArgs({
  options: {
    outfile: { type: "string", default: "dist/taskshim.cjs" },
    version: { type: "string" },
    "state-version": { type: "string" },
    runtime: { type: "string" },
  },
});

const root = resolve(import.meta.dirname, "..");

/** git's answer, or undefined outside a checkout or without git (its complaint is not shown). */
function git(...args) {
  try {
    return execFileSync("git", args, { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  } catch {
    return undefined;
  }
}

const head = git("rev-parse", "HEAD")?.trim();
const commit = head !== undefined && /^[0-9a-f]{40,64}$/.test(head) ? head : "unknown";
const dirty =
  commit !== "unknown" && (git("status", "--porcelain", "--untracked-files=no") ?? "").trim() !== "";

const BUILD_ID_LENGTH = 20;
// Not hex, so it cannot be mistaken for an id; exactly as long as one, so replacing it moves
// nothing in the bundle.
const BUILD_ID_PLACEHOLDER = "@@TASKSHIM_BUILD_ID@";
if (BUILD_ID_PLACEHOLDER.length !== BUILD_ID_LENGTH) throw new Error("build id placeholder: wrong length");

const define = {
  __TASKSHIM_COMMIT__: JSON.stringify(commit),
  __TASKSHIM_DIRTY__: JSON.stringify(dirty),
  __TASKSHIM_BUILD_ID__: JSON.stringify(BUILD_ID_PLACEHOLDER),
};
if (values.version) define.__TASKSHIM_VERSION__ = JSON.stringify(values.version);
if (values["state-version"]) define.__TASKSHIM_STATE_VERSION__ = String(Number(values["state-version"]));

// dockerode loads its ssh transport (ssh2) and BuildKit session (gRPC, protobuf) eagerly; the shim
// uses neither (it reaches the engine over a socket or TCP, and removal over ssh runs the ssh
// CLI). Bundling them costs ~1.4 MB of code and ~19 MB of memory at every start, so they are
// replaced by a module whose every export throws when used. That also drops ssh2's optional native
// addons, so the bundle needs no require() from disk (which a single executable cannot do).
// prom-client's Pushgateway likewise: the shim is scraped, it never pushes, and loading that
// module (and the http, https and zlib it takes at once) was 13 ms of every start's CPU.
const UNUSED = /^(ssh2|@grpc\/grpc-js|@grpc\/proto-loader|protobufjs)$/;
const unusedTransports = {
  name: "stub-unused-transports",
  setup(b) {
    b.onResolve({ filter: /.*/ }, (args) =>
      UNUSED.test(args.path) || (args.path === "./lib/pushgateway" && args.importer.includes("/prom-client/"))
        ? { path: args.path, namespace: "unused-stub" }
        : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: "unused-stub" }, (args) => ({
      contents: `const fail = (name) => function () { throw new Error(${JSON.stringify(args.path)} + "." + String(name) + ": not bundled in taskshim"); };
module.exports = new Proxy({}, { get: (_, name) => (name === "__esModule" ? false : fail(name)) });`,
      loader: "js",
    }));
  },
};

// Builtins the bundle loads on first use, not at start, through a stand-in:
// - fastify requires node:http2 and node:https at load (for its http2 and https options) and
//   docker-modem and prom-client's pushgateway node:https (for a TLS engine, a pushgateway): the
//   shim serves plain HTTP/1.1 and reaches a local engine, yet loading them costs ~6 MB of idle
//   RSS (OpenSSL's TLS and nghttp2's code and state; BENCHMARKS.md, B6);
// - the single binary starts from a V8 startup snapshot of the loaded bundle
//   (scripts/build-binary.mjs), which Node cannot make while node:http or node:tls is loaded
//   (their native parser and TLS state), and into which Node does not vouch for node:child_process,
//   node:stream/consumers or node:sea carrying over ("not yet fully verified" in a user snapshot):
//   they are loaded after the snapshot, when the shim first uses them.
// Every importer gets the stand-in, the shim's own modules too; none of them uses one of these at
// load, only inside functions (the snapshot build fails otherwise: node:http would be in it).
const LAZY_BUILTINS = /^(node:)?(http|http2|https|tls|child_process|stream\/consumers)$|^node:sea$/;
const requireBuiltin = createRequire(import.meta.url);
const lazyBuiltins = {
  name: "lazy-builtins",
  setup(b) {
    b.onResolve({ filter: LAZY_BUILTINS }, (args) =>
      // The stand-in's own require() of the real module is left to Node.
      args.namespace === "lazy-builtin"
        ? undefined
        : { path: args.path.replace(/^node:/, ""), namespace: "lazy-builtin" },
    );
    b.onLoad({ filter: /.*/, namespace: "lazy-builtin" }, (args) => {
      // An ES module's import of a CommonJS one copies its property names at load (esbuild's
      // __toESM): they are answered from the list of this very Node.js (the pinned one, which the
      // bundle runs on), so that the copy does not load the module; each copied property still
      // reads the real module's on use.
      const names = JSON.stringify(Object.getOwnPropertyNames(requireBuiltin(`node:${args.path}`)));
      return {
        contents: `let real;
const load = () => (real ??= require("node:${args.path}"));
const names = ${names};
module.exports = new Proxy({}, {
  get: (_, key) => load()[key],
  has: (_, key) => key in load(),
  ownKeys: () => (real ? Reflect.ownKeys(real) : names),
  getOwnPropertyDescriptor: (_, key) => {
    if (!real) return names.includes(key) ? { configurable: true, enumerable: true, writable: true, value: undefined } : undefined;
    const found = Reflect.getOwnPropertyDescriptor(real, key);
    return found && { ...found, configurable: true };
  },
});`,
        loader: "js",
      };
    });
  },
};

const built = await build({
  entryPoints: ["src/main.ts"],
  outfile: values.outfile,
  // Kept in memory: the build id is written in before the file is.
  write: false,
  bundle: true,
  platform: "node",
  target: "node26",
  // Lowered so that an older node can parse the bundle and reach its version check (src/main.ts):
  // a `using` declaration was a SyntaxError on Node 20, printed with a screen of minified code.
  supported: { using: false },
  format: "cjs",
  define,
  plugins: [unusedTransports, lazyBuiltins],
  // The environment and flags of every launch path (scripts/node-flags.mjs); `npm start` runs the
  // bundle by it.
  banner: { js: `#!/usr/bin/env -S ${[...LAUNCH_ENV, "node", ...NODE_FLAGS].join(" ")}` },
  legalComments: "none",
  // Comments and indentation are a third of the bundle, and V8 keeps a script's whole source in
  // memory for as long as it runs (to compile its functions lazily): 3.1 MB -> 2.1 MB. Whitespace
  // only: names are kept, so a stack trace still names every function (its line and column point
  // into the minified source).
  minifyWhitespace: true,
  logLevel: "warning",
});
const [output] = built.outputFiles;
if (built.outputFiles.length !== 1 || output === undefined) {
  throw new Error(`esbuild wrote ${built.outputFiles.length} files, expected the one bundle`);
}
const withPlaceholder = output.text;
// Every place esbuild put the define (the `typeof` test and the value may both hold it).
const places = withPlaceholder.split(BUILD_ID_PLACEHOLDER).length - 1;
if (places === 0) throw new Error("the build id placeholder is not in the bundle (src/version.ts changed?)");
const hash = createHash("sha256").update(withPlaceholder);
if (values.runtime) hash.update(`\0runtime ${values.runtime}`);
const buildId = hash.digest("hex").slice(0, BUILD_ID_LENGTH);
const source = withPlaceholder.replaceAll(BUILD_ID_PLACEHOLDER, buildId);

// esbuild escapes every non-ASCII character of strings, regexps and identifiers (its default
// charset), and the comments are gone; one non-ASCII byte left anywhere would make Node decode
// the whole source as a two-byte string: twice the memory (a → in a comment once cost 3 MB).
const bytes = Buffer.from(source, "utf8");
const offset = bytes.findIndex((byte) => byte > 0x7f);
if (offset >= 0) {
  throw new Error(`${values.outfile}: non-ASCII byte at offset ${offset}; the bundle must be ASCII`);
}
await mkdir(dirname(values.outfile), { recursive: true });
await writeFile(values.outfile, bytes);
await chmod(values.outfile, 0o755);
