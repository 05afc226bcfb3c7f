// What the single binary's startup snapshot would freeze: run by scripts/build-binary.mjs as
//   node --snapshot-blob <scratch file> --build-snapshot scripts/snapshot-check.cjs <bundle>
// it loads the bundle exactly as the snapshot build does (in Node's snapshot builder, up to the
// command line, which runs only once deserialized) with a trap on everything that differs from
// one start to the next: the environment, the clocks, randomness, the process's identity, the
// host, and the files read. Whatever the bundle reads while loading is baked into the snapshot
// and seen by every start of the binary as it was on the build machine, so each read is printed
// and the build fails, unless it is one of KNOWN below. Nothing of the traps reaches a binary:
// the blob this writes is scratch (the binary's own snapshot is made by `node --build-sea`).
// CommonJS, builtins only: that is all Node's snapshot builder can load.
"use strict";
const fs = require("node:fs");
const os = require("node:os");
const crypto = require("node:crypto");

/**
 * Reads known to be harmless when frozen, each with why. Any other read fails the build.
 * semver's `internal/debug.js` decides once whether to trace (`NODE_DEBUG=semver`): in the
 * binary that tracing cannot be switched on, and nothing else changes.
 */
const KNOWN = new Set(["env NODE_DEBUG"]);

const bundle = process.argv[2];
if (bundle === undefined) {
  process.stderr.write("usage: node --build-snapshot scripts/snapshot-check.cjs <bundle>\n");
  process.exit(2);
}
// Read before the traps: this file is not the bundle's read.
const source = fs.readFileSync(bundle, "utf8").replace(/^#!.*/, "");

/** @type {Map<string, string>} each read once, with the first frames of the bundle's stack */
const reads = new Map();
let trapping = true;
function note(what) {
  if (!trapping || reads.has(what)) return;
  reads.set(what, (new Error().stack ?? "").split("\n").slice(3, 6).join("\n"));
}

/** @type {Array<() => void>} puts back what a trap replaced */
const restore = [];
function trapCalls(owner, label, names) {
  for (const name of names) {
    const descriptor = Object.getOwnPropertyDescriptor(owner, name);
    const real = owner[name];
    if (descriptor === undefined || typeof real !== "function") continue;
    // node:crypto's getRandomValues is a fixed alias of webcrypto's, trapped on its prototype.
    if (!descriptor.configurable) continue;
    Object.defineProperty(owner, name, {
      configurable: true,
      enumerable: descriptor.enumerable,
      writable: true,
      value: function trapped(...args) {
        note(`${label}.${name}()`);
        return Reflect.apply(real, this, args);
      },
    });
    restore.push(() => Object.defineProperty(owner, name, descriptor));
  }
}
function trapProperties(owner, label, names) {
  for (const name of names) {
    const descriptor = Object.getOwnPropertyDescriptor(owner, name);
    if (descriptor === undefined) continue;
    const value = descriptor.get ? undefined : descriptor.value;
    Object.defineProperty(owner, name, {
      configurable: true,
      enumerable: descriptor.enumerable,
      get() {
        note(`${label}.${name}`);
        return descriptor.get ? descriptor.get.call(this) : value;
      },
      set(next) {
        if (descriptor.set) descriptor.set.call(this, next);
      },
    });
    restore.push(() => Object.defineProperty(owner, name, descriptor));
  }
}

// Node warns, once the load is over, of each builtin it does not vouch for in a user snapshot
// ("not yet fully verified"): a snapshot holding one may be out of step with the process that
// deserializes it. The bundle must load none of them at its top level (scripts/build.mjs).
/** @type {string[]} */
const unverified = [];
process.on("warning", (warning) => {
  const builtin = /built-in module "([^"]+)" works in user snapshot/.exec(warning.message);
  if (builtin) unverified.push(builtin[1]);
});

const env = process.env;
process.env = new Proxy(env, {
  get: (target, key) => {
    if (typeof key === "string") note(`env ${key}`);
    return Reflect.get(target, key);
  },
  has: (target, key) => {
    note(`env ${String(key)}`);
    return Reflect.has(target, key);
  },
  ownKeys: (target) => {
    note("env (all names)");
    return Reflect.ownKeys(target);
  },
});
restore.push(() => (process.env = env));
trapProperties(process, "process", ["pid", "ppid", "argv", "execArgv", "title", "execPath"]);
trapCalls(process, "process", [
  "hrtime",
  "cwd",
  "uptime",
  "memoryUsage",
  "cpuUsage",
  "resourceUsage",
  "getuid",
]);
trapCalls(process.hrtime, "process.hrtime", ["bigint"]);
trapCalls(Date, "Date", ["now"]);
trapCalls(Math, "Math", ["random"]);
trapCalls(performance, "performance", ["now"]);
trapCalls(crypto, "crypto", ["randomBytes", "randomUUID", "randomInt", "randomFillSync", "getRandomValues"]);
trapCalls(Object.getPrototypeOf(globalThis.crypto), "webcrypto", ["getRandomValues", "randomUUID"]);
trapCalls(os, "os", [
  "hostname",
  "cpus",
  "availableParallelism",
  "totalmem",
  "freemem",
  "networkInterfaces",
  "userInfo",
  "homedir",
  "tmpdir",
  "uptime",
  "loadavg",
  "release",
]);
trapCalls(fs, "fs", [
  "readFileSync",
  "readdirSync",
  "statSync",
  "lstatSync",
  "existsSync",
  "accessSync",
  "openSync",
  "realpathSync",
  "readlinkSync",
]);
const RealDate = Date;
globalThis.Date = new Proxy(RealDate, {
  construct: (target, args, newTarget) => {
    if (args.length === 0) note("new Date()");
    return Reflect.construct(target, args, newTarget);
  },
  apply: (target, self, args) => {
    note("Date()");
    return Reflect.apply(target, self, args);
  },
});
restore.push(() => (globalThis.Date = RealDate));

try {
  const module = { exports: {} };
  new Function("exports", "require", "module", "__filename", "__dirname", source)(
    module.exports,
    require,
    module,
    bundle,
    "/",
  );
} finally {
  trapping = false;
  for (const undo of restore.reverse()) undo();
}

// After the warnings of the load are out (they are emitted on a later tick).
setImmediate(() => {
  const unknown = [...reads].filter(([what]) => !KNOWN.has(what));
  for (const [what, where] of unknown)
    process.stderr.write(`snapshot-check: the bundle reads ${what} while loading:\n${where}\n`);
  for (const builtin of unverified)
    process.stderr.write(
      `snapshot-check: the bundle loads ${builtin} while loading, which Node does not vouch for in a snapshot\n`,
    );
  if (unknown.length + unverified.length > 0) {
    process.stderr.write(
      `snapshot-check: ${unknown.length} read(s) would be frozen into the startup snapshot and ` +
        `${unverified.length} builtin(s) held in it unverified; move them into a function the command line ` +
        "calls (or load the builtin on first use, scripts/build.mjs), or list a read that is harmless in KNOWN with why\n",
    );
    process.exitCode = 1;
  }
});
