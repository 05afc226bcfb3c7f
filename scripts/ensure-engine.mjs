#!/usr/bin/env node
// Make sure a container engine answers, and that the tools the integration tests need are installed.
//
// --engine docker (the default): finds the engine (DOCKER_HOST: unix:// or tcp://, else
// /var/run/docker.sock) and pings it. When it does not answer and we are root on Linux, installs
// Debian's docker.io (plus busybox-static, docker-registry, apache2-utils, openssh-client,
// openssh-server, qemu-user-static and the arm64 cross C++ runtime for the tests) and starts
// dockerd detached, logging to /var/log/taskshim-dockerd.log.
//
// --engine podman: a rootful `podman system service` of the project's own on
// unix:///run/taskshim-podman/podman.sock, with a private configuration under /var/lib/taskshim-podman
// (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF: the system's files are not
// read) and its log in /var/log/taskshim-podman.log. It never touches a running dockerd, docker0 or
// iptables: its default network is internal, so netavark adds no firewall rules. Same test tools.
//
// Fast and silent-ish when everything is already there.
//
// Usage: node scripts/ensure-engine.mjs [--engine docker|podman] [--quiet] [--engine-only]
// No dependencies on purpose: this runs before `npm ci` results are trusted and on bare machines.

import { spawn, spawnSync } from "node:child_process";
import {
  accessSync,
  closeSync,
  constants,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { request } from "node:http";
import { delimiter, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

const DEFAULT_SOCKET = "/var/run/docker.sock";
const DOCKERD_LOG = "/var/log/taskshim-dockerd.log";
const APT_LOG = "/var/log/taskshim-apt.log";
const PING_TIMEOUT_MS = 1_500;
const ENGINE_START_TIMEOUT_MS = 60_000;
/** One `GET /version` of an engine that answers `_ping`. */
const VERSION_TIMEOUT_MS = 10_000;
const APT_UPDATE_TIMEOUT_MS = 5 * 60_000;
const APT_INSTALL_TIMEOUT_MS = 15 * 60_000;
const SBIN_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
/** Where Debian's *-arm64-cross packages put arm64 shared libraries (an amd64 host needs no multiarch). */
const ARM64_CROSS_LIB = "/usr/aarch64-linux-gnu/lib";

/**
 * Binary → the Debian package that provides it. `static` means the binary must not need a loader;
 * `path` names a file that must exist instead (a library, for which `bin` is only its label).
 */
const REQUIRED = [
  { bin: "dockerd", pkg: "docker.io", engine: true },
  { bin: "busybox", pkg: "busybox-static", static: true },
  { bin: "docker-registry", pkg: "docker-registry" },
  { bin: "htpasswd", pkg: "apache2-utils" },
  { bin: "ssh", pkg: "openssh-client" },
  // `taskshim fence --ssh` is tested against a real sshd the test starts on a free port.
  { bin: "sshd", pkg: "openssh-server" },
  // The arm64 release binary (test/release-artifacts.test.ts) runs under user-mode emulation, its
  // dynamic loader and libraries (the arm64 Node.js's NEEDED: libc, libm, libdl, libpthread,
  // libstdc++, libgcc_s, libatomic) taken from the cross packages (qemu -L /usr/aarch64-linux-gnu).
  { bin: "qemu-aarch64-static", pkg: "qemu-user-static" },
  { bin: "arm64 libstdc++.so.6", path: `${ARM64_CROSS_LIB}/libstdc++.so.6`, pkg: "libstdc++6-arm64-cross" },
  { bin: "arm64 libatomic.so.1", path: `${ARM64_CROSS_LIB}/libatomic.so.1`, pkg: "libatomic1-arm64-cross" },
];

/** What the Podman engine needs beyond the test tools; netavark is not on PATH but in podman's helper dir. */
const PODMAN_REQUIRED = [
  { bin: "podman", pkg: "podman", engine: true },
  { bin: "conmon", pkg: "conmon", engine: true },
  // crun fails on this kind of host ("cgroups in hybrid mode not supported"): runc it is.
  { bin: "runc", pkg: "runc", engine: true },
  { bin: "netavark", pkg: "netavark", engine: true, dirs: ["/usr/lib/podman", "/usr/libexec/podman"] },
];

const PODMAN_DIR = "/var/lib/taskshim-podman";
const PODMAN_RUN_DIR = "/run/taskshim-podman";
const PODMAN_SOCKET = `${PODMAN_RUN_DIR}/podman.sock`;
const PODMAN_LOG = "/var/log/taskshim-podman.log";
const PODMAN_NETWORK = "taskshim";
const PODMAN_SUBNET = "10.89.77.0/24";
// Named, not podmanN: another Podman on the host numbers its bridges from its own config dir only.
const PODMAN_BRIDGE = "taskshim0";
const PODMAN_CONF = {
  CONTAINERS_CONF: `${PODMAN_DIR}/containers.conf`,
  CONTAINERS_STORAGE_CONF: `${PODMAN_DIR}/storage.conf`,
  CONTAINERS_REGISTRIES_CONF: `${PODMAN_DIR}/registries.conf`,
};

const USAGE = "usage: ensure-engine.mjs [--engine docker|podman] [--quiet] [--engine-only]";
const args = process.argv.slice(2);
const quiet = args.includes("--quiet");
// `npm start` needs only the engine; the test tools are for `npm test`.
const engineOnly = args.includes("--engine-only");
const engine = engineArg(args);
const unknown = args.filter(
  (a, i) =>
    a !== "--quiet" &&
    a !== "--engine-only" &&
    a !== "--engine" &&
    !a.startsWith("--engine=") &&
    args[i - 1] !== "--engine",
);
if (unknown.length > 0) fail(`unknown argument(s): ${unknown.join(" ")} (${USAGE})`, 2);

const isRoot = typeof process.getuid === "function" && process.getuid() === 0;
const isLinux = process.platform === "linux";
const searchPath = [...new Set([...(process.env.PATH ?? "").split(delimiter).filter(Boolean), ...SBIN_DIRS])];
const childEnv = { ...process.env, PATH: searchPath.join(delimiter), DEBIAN_FRONTEND: "noninteractive" };
// The engines started here outlive the caller, and so would its TMPDIR inside them: dockerd hands
// it to containerd and runc, which write each exec's spec there. A test project's TMPDIR
// (scripts/test-engines.mjs) is removed when the project exits, and every exec then failed with
// "OCI runtime exec failed: open $TMPDIR/runc-process…: no such file or directory".
delete childEnv.TMPDIR;

try {
  await (engine === "podman" ? mainPodman() : main());
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

/** The Podman mode: the project's own rootful `podman system service` on {@link PODMAN_SOCKET}. */
async function mainPodman() {
  const endpoint = { kind: "unix", socketPath: PODMAN_SOCKET, label: `unix://${PODMAN_SOCKET}` };
  const tools = engineOnly ? [] : REQUIRED.filter((r) => !r.engine);
  const missing = [...PODMAN_REQUIRED, ...tools].filter((r) => !hasBinary(r));

  if (await ping(endpoint)) {
    await expectPodman(endpoint);
    const toolsMissing = missing.filter((r) => !r.engine);
    if (toolsMissing.length > 0) {
      if (isRoot && isLinux) installPackages(toolsMissing);
      else warn(`podman engine OK, but test tools are missing: ${toolsMissing.map((r) => r.bin).join(", ")}`);
    }
    info(`podman engine OK at ${endpoint.label}`);
    return;
  }
  if (!isLinux || !isRoot) {
    fail(
      `no Podman service answers at ${endpoint.label}; as root, \`node scripts/ensure-engine.mjs --engine podman\` ` +
        "installs Debian's podman and starts one (rootless Podman is not supported by this script)",
    );
  }
  // Recommends (slirp4netns, uidmap, fuse-overlayfs, …) serve rootless Podman, which this is not.
  if (missing.length > 0) installPackages(missing, ["--no-install-recommends"]);

  const running = findProcess((argv) => argv.includes("service") && argv.includes(endpoint.label));
  const started = Date.now();
  const logOffset = fileSize(PODMAN_LOG);
  let child;
  if (running !== undefined) {
    // Ours, still coming up (or hung): never a second service on the same storage.
    info(`a podman service (pid ${running}) is starting on ${endpoint.label}; waiting for it`);
  } else {
    writePodmanConfig();
    ensurePodmanNetwork();
    child = startPodmanService(endpoint);
  }
  await waitForPodman(endpoint, child, logOffset);
  await expectPodman(endpoint);
  info(
    `podman engine started at ${endpoint.label} in ${((Date.now() - started) / 1000).toFixed(1)} s (log: ${PODMAN_LOG})`,
  );
}

/** The environment every podman command of ours runs in: the private configuration only. */
function podmanEnv() {
  return { ...childEnv, ...PODMAN_CONF };
}

/**
 * The private containers.conf, storage.conf and registries.conf (written only when they differ).
 * @param {string} defaultNetwork
 */
function writePodmanConfig(defaultNetwork = PODMAN_NETWORK) {
  for (const dir of [PODMAN_DIR, `${PODMAN_DIR}/tmp`, `${PODMAN_DIR}/volumes`, `${PODMAN_DIR}/networks`]) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }
  const nofile = hardLimit("Max open files", () => Number(readFileSync("/proc/sys/fs/nr_open", "utf8")));
  const pidMax = Number(readFileSync("/proc/sys/kernel/pid_max", "utf8"));
  const nproc = Math.min(
    hardLimit("Max processes", () => pidMax),
    pidMax,
  );
  const containersConf = [
    "# Written by taskshim's scripts/ensure-engine.mjs --engine podman; rewritten on every start.",
    "[containers]",
    // Podman's default ulimits (nofile 1048576, nproc 4194304) are above this host's hard limits:
    // runc then fails with `error setting rlimit … operation not permitted`.
    `default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]`,
    "[engine]",
    // No systemd here; and the events in a file, not the journal.
    'cgroup_manager = "cgroupfs"',
    'events_logger = "file"',
    `events_logfile_path = "${PODMAN_DIR}/events.log"`,
    // File locks under our dir, not the shared /dev/shm/libpod_lock of any other Podman.
    'lock_type = "file"',
    `tmp_dir = "${PODMAN_DIR}/tmp"`,
    `volume_path = "${PODMAN_DIR}/volumes"`,
    // No static_dir: conmon's exit command (`podman container cleanup`) is given --root and reads
    // <root>/libpod as its database; another static_dir leaves exited containers `stopped`.
    // crun: "cgroups in hybrid mode not supported" on this kind of host.
    'runtime = "runc"',
    "[network]",
    `network_config_dir = "${PODMAN_DIR}/networks"`,
    `default_network = "${defaultNetwork}"`,
    "",
  ].join("\n");
  const storageConf = [
    "[storage]",
    'driver = "overlay"',
    `runroot = "${PODMAN_DIR}/runroot"`,
    `graphroot = "${PODMAN_DIR}/graph"`,
    "",
  ].join("\n");
  const registriesConf = [
    "unqualified-search-registries = []",
    // Docker treats registries on 127.0.0.0/8 as insecure (plain HTTP allowed); the same here.
    "[[registry]]",
    'location = "127.0.0.1"',
    "insecure = true",
    "[[registry]]",
    'location = "localhost"',
    "insecure = true",
    "",
  ].join("\n");
  writeIfChanged(PODMAN_CONF.CONTAINERS_CONF, containersConf);
  writeIfChanged(PODMAN_CONF.CONTAINERS_STORAGE_CONF, storageConf);
  writeIfChanged(PODMAN_CONF.CONTAINERS_REGISTRIES_CONF, registriesConf);
}

/**
 * The default network, internal: netavark 1.4 adds iptables rules for any other bridge network
 * (it has no "none" firewall driver); an internal one leaves the host's firewall and docker0
 * alone. It is created while default_network names another (creating the default one fails,
 * "already used"), then made the default.
 */
function ensurePodmanNetwork() {
  const file = `${PODMAN_DIR}/networks/${PODMAN_NETWORK}.json`;
  if (!existsSync(file)) {
    writePodmanConfig("podman");
    run(
      "podman",
      ["network", "create", "--internal", "--subnet", PODMAN_SUBNET, PODMAN_NETWORK],
      60_000,
      PODMAN_LOG,
      podmanEnv(),
    );
    // Podman 4.3 has no --interface-name; its network file names the bridge (read at the service's start).
    const created = JSON.parse(readFileSync(file, "utf8"));
    writeFileSync(file, JSON.stringify({ ...created, network_interface: PODMAN_BRIDGE }, null, 5) + "\n");
    writePodmanConfig();
  }
  /** @type {{ internal?: boolean }} */
  const network = JSON.parse(readFileSync(file, "utf8"));
  if (network.internal !== true) {
    fail(
      `${file}: the network ${PODMAN_NETWORK} is not internal (netavark would change iptables); remove it`,
    );
  }
}

/** @param {{ socketPath: string, label: string }} endpoint */
function startPodmanService(endpoint) {
  mkdirSync(PODMAN_RUN_DIR, { recursive: true, mode: 0o700 });
  // A socket file left by a service that is gone (this one did not answer, and no process serves it).
  if (existsSync(endpoint.socketPath)) unlinkSync(endpoint.socketPath);
  const log = openSync(PODMAN_LOG, "a");
  try {
    // detached → setsid(): it outlives this script; --time=0: it never exits for being idle.
    const child = spawn("podman", ["system", "service", "--time=0", endpoint.label], {
      detached: true,
      stdio: ["ignore", log, log],
      env: podmanEnv(),
      cwd: "/", // as dockerd's: never a directory that may be removed under it
    });
    child.unref();
    return child;
  } finally {
    closeSync(log);
  }
}

/**
 * @param {{ kind: string, socketPath: string, label: string }} endpoint
 * @param {import("node:child_process").ChildProcess | undefined} child
 * @param {number} logOffset
 */
async function waitForPodman(endpoint, child, logOffset) {
  /** @type {string | undefined} */
  let exited;
  child?.once("exit", (code, signal) => (exited = signal ? `signal ${signal}` : `code ${code}`));
  child?.once("error", (err) => (exited = err.message));
  const deadline = Date.now() + ENGINE_START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (await ping(endpoint, 1_000)) return;
    if (exited !== undefined) {
      fail(
        `podman system service exited (${exited}) before answering: ${lastLine(PODMAN_LOG, logOffset)} (see ${PODMAN_LOG})`,
      );
    }
    await sleep(100);
  }
  fail(
    `podman did not answer at ${endpoint.label} within ${ENGINE_START_TIMEOUT_MS / 1000} s: ${lastLine(PODMAN_LOG, logOffset)} (see ${PODMAN_LOG})`,
  );
}

/**
 * Fails unless the engine at the socket says it is Podman (`GET /version`: Components[0].Name).
 * A service that answers `_ping` may take seconds more for its first `/version` (it sets its
 * runtime up then; 1.5 s was not enough on a loaded machine): asked again until
 * ENGINE_START_TIMEOUT_MS while it gives no answer; an answer that is not Podman's fails at once.
 * @param {{ socketPath: string, label: string }} endpoint
 */
async function expectPodman(endpoint) {
  const deadline = Date.now() + ENGINE_START_TIMEOUT_MS;
  let body = await engineVersionBody(endpoint);
  while (body === "" && Date.now() < deadline) {
    await sleep(500);
    body = await engineVersionBody(endpoint);
  }
  let name;
  try {
    name = JSON.parse(body).Components?.[0]?.Name;
  } catch {
    name = undefined;
  }
  if (name !== "Podman Engine") {
    fail(
      `the engine at ${endpoint.label} is not Podman (GET /version: ${body.slice(0, 120) || "no answer"})`,
    );
  }
}

/**
 * The body of the engine's `GET /version`, or "" when it gave none within VERSION_TIMEOUT_MS.
 * @param {{ socketPath: string }} endpoint
 * @returns {Promise<string>}
 */
function engineVersionBody(endpoint) {
  return new Promise((resolve) => {
    const req = request(
      { socketPath: endpoint.socketPath, path: "/version", method: "GET", headers: { host: "podman" } },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk) => (text += chunk));
        res.on("end", () => resolve(text));
        res.on("error", () => resolve(""));
      },
    );
    req.setTimeout(VERSION_TIMEOUT_MS, () => req.destroy());
    req.on("error", () => resolve(""));
    req.end();
  });
}

/**
 * A hard limit of this process (/proc/self/limits), which the service and its containers inherit.
 * @param {string} name @param {() => number} ifUnlimited
 */
function hardLimit(name, ifUnlimited) {
  const line = readFileSync("/proc/self/limits", "utf8")
    .split("\n")
    .find((l) => l.startsWith(name));
  const hard = line?.slice(name.length).trim().split(/\s+/)[1];
  if (hard === undefined) fail(`cannot read "${name}" from /proc/self/limits`);
  return hard === "unlimited" ? ifUnlimited() : Number(hard);
}

/** @param {string} path @param {string} content */
function writeIfChanged(path, content) {
  let current;
  try {
    current = readFileSync(path, "utf8");
  } catch {
    current = undefined;
  }
  if (current !== content) writeFileSync(path, content, { mode: 0o644 });
}

/**
 * The pid of a podman process whose argv matches, if any (read from /proc).
 * @param {(argv: string[]) => boolean} matches
 */
function findProcess(matches) {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").filter(Boolean);
      if (argv[0] !== undefined && /(^|\/)podman$/.test(argv[0]) && matches(argv)) return Number(entry);
    } catch {
      // gone meanwhile
    }
  }
  return undefined;
}

/** @param {string[]} argv @returns {"docker" | "podman"} */
function engineArg(argv) {
  const at = argv.indexOf("--engine");
  const value =
    at >= 0 ? argv[at + 1] : argv.find((a) => a.startsWith("--engine="))?.slice("--engine=".length);
  if (value === undefined) return "docker";
  if (value === "docker" || value === "podman") return value;
  return fail(`--engine ${value}: expected docker or podman (${USAGE})`, 2);
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

/** @param {{ bin: string, static?: boolean, dirs?: string[], path?: string }} req */
function hasBinary(req) {
  if (req.path !== undefined) return existsSync(req.path);
  const path = findBinary(req.bin, req.dirs);
  if (path === undefined) return false;
  return req.static ? isStaticElf(path) : true;
}

/** @param {string} bin @param {string[]} [extraDirs] */
function findBinary(bin, extraDirs = []) {
  for (const dir of [...searchPath, ...extraDirs]) {
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

/** @param {{ bin: string, pkg: string }[]} missing @param {string[]} [aptFlags] */
function installPackages(missing, aptFlags = []) {
  const pkgs = [...new Set(missing.map((r) => r.pkg))];
  info(`installing ${pkgs.join(" ")} (missing: ${missing.map((r) => r.bin).join(", ")}; log: ${APT_LOG})`);
  if (findBinary("apt-get") === undefined) {
    fail(`cannot install ${pkgs.join(" ")}: apt-get not found (this script supports Debian/Ubuntu)`);
  }
  const lockWait = ["-o", "DPkg::Lock::Timeout=120"];
  run("apt-get", ["update", ...lockWait], APT_UPDATE_TIMEOUT_MS);
  run("apt-get", ["install", "-y", ...aptFlags, ...lockWait, ...pkgs], APT_INSTALL_TIMEOUT_MS);
  const still = missing.filter((r) => !hasBinary(r));
  if (still.length > 0) {
    fail(
      `installed ${pkgs.join(" ")} but still missing: ${still.map((r) => r.bin).join(", ")} (see ${APT_LOG})`,
    );
  }
}

/**
 * Run a command with a deadline, appending its output to a log (the apt log unless given).
 * @param {string} cmd @param {string[]} argv @param {number} timeoutMs
 */
function run(cmd, argv, timeoutMs, logPath = APT_LOG, env = childEnv) {
  const log = openSync(logPath, "a");
  try {
    const res = spawnSync(cmd, argv, {
      env,
      stdio: ["ignore", log, log],
      timeout: timeoutMs,
      killSignal: "SIGKILL",
    });
    const what = `${cmd} ${argv.join(" ")}`;
    if (res.error) fail(`${what} failed: ${res.error.message} (see ${logPath})`);
    if (res.signal)
      fail(`${what} killed by ${res.signal} after ${timeoutMs / 1000} s limit (see ${logPath})`);
    if (res.status !== 0) fail(`${what} exited ${res.status}: ${lastLine(logPath)} (see ${logPath})`);
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
    // cwd "/": an engine outlives the directory it was started from (a CI clone, removed after), and
    // conmon, which inherits it, fails every start once it is gone ("Failed to get working directory").
    const child = spawn(dockerd, argv, {
      detached: true,
      stdio: ["ignore", log, log],
      env: childEnv,
      cwd: "/",
    });
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
