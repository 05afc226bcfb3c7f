#!/usr/bin/env node
// Make sure a Docker Engine answers, and that the tools the integration tests need are installed.
//
// Finds the engine (DOCKER_HOST: unix:// or tcp://, else /var/run/docker.sock) and pings it. When it
// does not answer and we are root on Linux, installs Debian's docker.io (plus busybox-static,
// docker-registry, apache2-utils, openssh-client and openssh-server for the tests) and starts dockerd detached, logging to
// /var/log/taskshim-dockerd.log. Fast and silent-ish when everything is already there.
//
// Usage: node scripts/ensure-engine.mjs [--quiet] [--engine-only]
// No dependencies on purpose: this runs before `npm ci` results are trusted and on bare machines.

import { spawn, spawnSync } from "node:child_process";
import { accessSync, closeSync, constants, fstatSync, openSync, readSync, statSync } from "node:fs";
import { request } from "node:http";
import { delimiter, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

const DEFAULT_SOCKET = "/var/run/docker.sock";
const DOCKERD_LOG = "/var/log/taskshim-dockerd.log";
const APT_LOG = "/var/log/taskshim-apt.log";
const PING_TIMEOUT_MS = 1_500;
const ENGINE_START_TIMEOUT_MS = 60_000;
const APT_UPDATE_TIMEOUT_MS = 5 * 60_000;
const APT_INSTALL_TIMEOUT_MS = 15 * 60_000;
const SBIN_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/** Binary → the Debian package that provides it. `static` means the binary must not need a loader. */
const REQUIRED = [
  { bin: "dockerd", pkg: "docker.io", engine: true },
  { bin: "busybox", pkg: "busybox-static", static: true },
  { bin: "docker-registry", pkg: "docker-registry" },
  { bin: "htpasswd", pkg: "apache2-utils" },
  { bin: "ssh", pkg: "openssh-client" },
  // `taskshim fence --ssh` is tested against a real sshd the test starts on a free port.
  { bin: "sshd", pkg: "openssh-server" },
];

const args = process.argv.slice(2);
const quiet = args.includes("--quiet");
// `npm start` needs only the engine; the test tools are for `npm test`.
const engineOnly = args.includes("--engine-only");
const unknown = args.filter((a) => a !== "--quiet" && a !== "--engine-only");
if (unknown.length > 0)
  fail(`unknown argument(s): ${unknown.join(" ")} (usage: ensure-engine.mjs [--quiet] [--engine-only])`, 2);

const isRoot = typeof process.getuid === "function" && process.getuid() === 0;
const isLinux = process.platform === "linux";
const searchPath = [...new Set([...(process.env.PATH ?? "").split(delimiter).filter(Boolean), ...SBIN_DIRS])];
const childEnv = { ...process.env, PATH: searchPath.join(delimiter), DEBIAN_FRONTEND: "noninteractive" };

try {
  await main();
} catch (err) {
  fail(`unexpected error: ${err instanceof Error ? err.message : String(err)}`);
}

async function main() {
  const endpoint = parseEndpoint(process.env.DOCKER_HOST);
  const engineUp = await ping(endpoint);
  const missing = REQUIRED.filter((r) => (!engineOnly || r.engine) && !hasBinary(r));

  if (engineUp) {
    const toolsMissing = missing.filter((r) => !r.engine);
    if (toolsMissing.length > 0) {
      if (isRoot && isLinux) {
        installPackages(toolsMissing);
      } else {
        // The engine is what `npm start` needs; the tools only matter to the integration tests.
        warn(
          `engine OK, but test tools are missing: ${toolsMissing.map((r) => r.bin).join(", ")} ` +
            `(as root: apt-get install -y ${toolsMissing.map((r) => r.pkg).join(" ")})`,
        );
      }
    }
    info(`docker engine OK at ${endpoint.label}`);
    return;
  }

  if (!isLinux || !isRoot) {
    fail(
      `no Docker Engine answers at ${endpoint.label}; start one (as root: \`node scripts/ensure-engine.mjs\` ` +
        `installs docker.io and starts dockerd) or point DOCKER_HOST at a running engine`,
    );
  }
  if (endpoint.kind === "tcp") {
    fail(
      `no Docker Engine answers at ${endpoint.label} (DOCKER_HOST); this script only starts a local ` +
        `dockerd on a unix socket: start that engine yourself or unset DOCKER_HOST`,
    );
  }

  if (missing.length > 0) installPackages(missing);

  // The package's maintainer scripts may have started the engine already (sysvinit hosts).
  if (await ping(endpoint)) {
    info(`docker engine OK at ${endpoint.label} (started by the docker.io package)`);
    return;
  }

  const started = Date.now();
  const logOffset = fileSize(DOCKERD_LOG);
  const child = startDockerd(endpoint);
  await waitForEngine(endpoint, child, logOffset);
  info(
    `docker engine started at ${endpoint.label} in ${((Date.now() - started) / 1000).toFixed(1)} s (log: ${DOCKERD_LOG})`,
  );
}

/** @param {string | undefined} dockerHost */
function parseEndpoint(dockerHost) {
  if (!dockerHost) return { kind: "unix", socketPath: DEFAULT_SOCKET, label: `unix://${DEFAULT_SOCKET}` };
  if (dockerHost.startsWith("unix://")) {
    const socketPath = dockerHost.slice("unix://".length) || DEFAULT_SOCKET;
    return { kind: "unix", socketPath, label: `unix://${socketPath}` };
  }
  const withScheme = dockerHost.includes("://") ? dockerHost : `tcp://${dockerHost}`;
  let url;
  try {
    url = new URL(withScheme);
  } catch {
    fail(`DOCKER_HOST=${dockerHost} is not a valid unix:// or tcp:// address`);
  }
  if (url.protocol !== "tcp:") fail(`DOCKER_HOST=${dockerHost}: only unix:// and tcp:// are supported`);
  if (process.env.DOCKER_TLS_VERIFY === "1")
    fail(`DOCKER_HOST=${dockerHost}: TLS (DOCKER_TLS_VERIFY=1) is not supported`);
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = Number(url.port || "2375");
  return { kind: "tcp", host, port, label: `tcp://${url.host || `${host}:${port}`}` };
}

/**
 * GET /_ping with a hard deadline. Resolves true only on "200 OK" with body "OK".
 * @param {ReturnType<typeof parseEndpoint>} endpoint
 */
function ping(endpoint, timeoutMs = PING_TIMEOUT_MS) {
  return new Promise((resolve) => {
    const target =
      endpoint.kind === "unix"
        ? { socketPath: endpoint.socketPath }
        : { host: endpoint.host, port: endpoint.port };
    const req = request({ ...target, path: "/_ping", method: "GET", headers: { host: "docker" } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => {
        if (body.length < 64) body += chunk;
      });
      res.on("end", () => finish(res.statusCode === 200 && body.trim() === "OK"));
      res.on("error", () => finish(false));
    });
    const timer = setTimeout(() => req.destroy(new Error("ping timeout")), timeoutMs);
    /** @param {boolean} ok */
    function finish(ok) {
      clearTimeout(timer);
      resolve(ok);
    }
    req.on("error", () => finish(false));
    req.end();
  });
}

/** @param {{ bin: string, static?: boolean }} req */
function hasBinary(req) {
  const path = findBinary(req.bin);
  if (path === undefined) return false;
  return req.static ? isStaticElf(path) : true;
}

/** @param {string} bin */
function findBinary(bin) {
  for (const dir of searchPath) {
    const candidate = join(dir, bin);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/**
 * A static ELF has no PT_INTERP program header; the test images copy busybox into an empty rootfs,
 * so a dynamically linked busybox (Debian's `busybox` package) would not run there.
 * @param {string} path
 */
function isStaticElf(path) {
  let fd;
  try {
    fd = openSync(path, "r");
    const head = Buffer.alloc(64);
    if (readSync(fd, head, 0, 64, 0) < 64 || head.readUInt32BE(0) !== 0x7f454c46) return false;
    const is64 = head[4] === 2;
    const le = head[5] === 1;
    const u16 = (/** @type {Buffer} */ b, /** @type {number} */ o) =>
      le ? b.readUInt16LE(o) : b.readUInt16BE(o);
    const u32 = (/** @type {Buffer} */ b, /** @type {number} */ o) =>
      le ? b.readUInt32LE(o) : b.readUInt32BE(o);
    const phoff = is64 ? Number(le ? head.readBigUInt64LE(32) : head.readBigUInt64BE(32)) : u32(head, 28);
    const phentsize = u16(head, is64 ? 54 : 42);
    const phnum = u16(head, is64 ? 56 : 44);
    const table = Buffer.alloc(phentsize * phnum);
    readSync(fd, table, 0, table.length, phoff);
    for (let i = 0; i < phnum; i++) {
      if (u32(table, i * phentsize) === 3 /* PT_INTERP */) return false;
    }
    return true;
  } catch {
    return false;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** @param {{ bin: string, pkg: string }[]} missing */
function installPackages(missing) {
  const pkgs = [...new Set(missing.map((r) => r.pkg))];
  info(`installing ${pkgs.join(" ")} (missing: ${missing.map((r) => r.bin).join(", ")}; log: ${APT_LOG})`);
  if (findBinary("apt-get") === undefined) {
    fail(`cannot install ${pkgs.join(" ")}: apt-get not found (this script supports Debian/Ubuntu)`);
  }
  const lockWait = ["-o", "DPkg::Lock::Timeout=120"];
  run("apt-get", ["update", ...lockWait], APT_UPDATE_TIMEOUT_MS);
  run("apt-get", ["install", "-y", ...lockWait, ...pkgs], APT_INSTALL_TIMEOUT_MS);
  const still = missing.filter((r) => !hasBinary(r));
  if (still.length > 0) {
    fail(
      `installed ${pkgs.join(" ")} but still missing: ${still.map((r) => r.bin).join(", ")} (see ${APT_LOG})`,
    );
  }
}

/**
 * Run a command with a deadline, appending its output to the apt log.
 * @param {string} cmd @param {string[]} argv @param {number} timeoutMs
 */
function run(cmd, argv, timeoutMs) {
  const log = openSync(APT_LOG, "a");
  try {
    const res = spawnSync(cmd, argv, {
      env: childEnv,
      stdio: ["ignore", log, log],
      timeout: timeoutMs,
      killSignal: "SIGKILL",
    });
    const what = `${cmd} ${argv.join(" ")}`;
    if (res.error) fail(`${what} failed: ${res.error.message} (see ${APT_LOG})`);
    if (res.signal)
      fail(`${what} killed by ${res.signal} after ${timeoutMs / 1000} s limit (see ${APT_LOG})`);
    if (res.status !== 0) fail(`${what} exited ${res.status}: ${lastLine(APT_LOG)} (see ${APT_LOG})`);
  } finally {
    closeSync(log);
  }
}

/** @param {ReturnType<typeof parseEndpoint>} endpoint */
function startDockerd(endpoint) {
  const dockerd = findBinary("dockerd");
  if (dockerd === undefined) fail("dockerd not found after install");
  const argv = endpoint.socketPath === DEFAULT_SOCKET ? [] : ["-H", `unix://${endpoint.socketPath}`];
  const log = openSync(DOCKERD_LOG, "a");
  try {
    // detached → setsid(): own session and process group, so it outlives this script and its terminal.
    const child = spawn(dockerd, argv, { detached: true, stdio: ["ignore", log, log], env: childEnv });
    child.unref();
    return child;
  } finally {
    closeSync(log);
  }
}

/**
 * @param {ReturnType<typeof parseEndpoint>} endpoint
 * @param {import("node:child_process").ChildProcess} child
 * @param {number} logOffset where this dockerd's output starts in the log
 */
async function waitForEngine(endpoint, child, logOffset) {
  /** @type {string | undefined} */
  let exited;
  child.once("exit", (code, signal) => (exited = signal ? `signal ${signal}` : `code ${code}`));
  child.once("error", (err) => (exited = err.message));
  const deadline = Date.now() + ENGINE_START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (await ping(endpoint, 1_000)) return;
    if (exited !== undefined) {
      // Another dockerd (pid file) may still be coming up on the same socket: give it the full wait.
      if (!/pid file found/i.test(readTail(DOCKERD_LOG, logOffset))) {
        const why = lastLine(DOCKERD_LOG, logOffset);
        fail(`dockerd exited (${exited}) before answering: ${why} (see ${DOCKERD_LOG})`);
      }
    }
    await sleep(250);
  }
  const why = lastLine(DOCKERD_LOG, logOffset);
  fail(
    `dockerd did not answer at ${endpoint.label} within ${ENGINE_START_TIMEOUT_MS / 1000} s: ${why} (see ${DOCKERD_LOG})`,
  );
}

/**
 * The log text appended after byte offset `from` (at most the last `bytes` of it).
 * @param {string} path
 */
function readTail(path, from = 0, bytes = 8192) {
  let fd;
  try {
    fd = openSync(path, "r");
    const size = fstatSync(fd).size;
    const start = Math.max(from, size - bytes);
    const buf = Buffer.alloc(Math.max(0, size - start));
    readSync(fd, buf, 0, buf.length, start);
    return buf.toString("utf8");
  } catch {
    return "";
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** @param {string} path */
function lastLine(path, from = 0) {
  const lines = readTail(path, from)
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean);
  return (lines.at(-1) ?? "(no output)").slice(0, 300);
}

/** @param {string} path */
function fileSize(path) {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}

/** @param {string} msg */
function info(msg) {
  if (!quiet) console.log(`ensure-engine: ${msg}`);
}

/** @param {string} msg */
function warn(msg) {
  console.error(`ensure-engine: warning: ${msg}`);
}

/** @param {string} msg @returns {never} */
function fail(msg, code = 1) {
  console.error(`ensure-engine: error: ${msg}`);
  process.exit(code);
}
