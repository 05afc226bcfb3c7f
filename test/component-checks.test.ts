import { createHash } from "node:crypto";
import { chmod, mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { instanceCheck, type CheckRecord, type ReleaseServer } from "./support/dstack-instance-check.js";
import { bundleLaunch, SHIM_BUNDLE, ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * A release dstack server's instance checks against the real built shim (docs/operations.md,
 * "Component checks from a dstack server"): five checks replayed by
 * test/support/dstack-instance-check.ts, the server expecting 0.21.3 for the shim and the runner,
 * against a local download server that counts full bodies and 304s. The running taskshim never
 * reports 0.21.3, so every check posts a dstack-shim install: the same bytes cost one full
 * download, new bytes one more, and dstack's own shim is refused and never replaces taskshim.
 */

const DSTACK_VERSION = "0.21.3";
const t0 = performance.now();

/** The download server: a file per path, ETag and Last-Modified, and what it sent per path. */
interface Downloads {
  readonly base: string;
  put(path: string, body: string): void;
  /** 200s with a body, and 304s, of one path. */
  count(path: string): { full: number; notModified: number };
}

let downloads: Downloads;
let server: Server;
let installedTaskshim: string;
let shim: ShimProcess | undefined;
const homes: string[] = [];

/** `taskshim version <v>`, standing for a newer taskshim release published at the URL. */
const newerTaskshim = (version: string): string =>
  [
    "#!/bin/sh",
    `if [ "$1" = "--version" ]; then echo "taskshim version ${version}"; exit 0; fi`,
    `if [ "$1" = "version" ] && [ "$2" = "--json" ]; then echo '{"version":"${version}","build_id":"new-${version}"}'; exit 0; fi`,
    "exit 2",
    "",
  ].join("\n");

/**
 * A stand-in for dstack's Go dstack-shim 0.21.3 (the real one is not fetched from the internet):
 * its version line, and a mark beside itself if it is ever run with anything else (dstack's shim
 * would start serving).
 */
const GO_SHIM = [
  "#!/bin/sh",
  `if [ "$1" = "--version" ]; then echo "dstack-shim version ${DSTACK_VERSION}"; exit 0; fi`,
  'echo "$@" >> "$(dirname "$0")/go-shim-started"',
  "exit 0",
  "",
].join("\n");
const RUNNER = `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "dstack-runner version ${DSTACK_VERSION}"; exit 0; fi\nexit 2\n`;

beforeAll(async () => {
  // The installed taskshim, as a deploy leaves it at --shim-binary-path: the built bundle on the
  // pinned Node.js, with its shebang's flags and environment.
  const launch = bundleLaunch();
  const env = Object.entries(launch.env).map(([k, v]) => `${k}=${v}`);
  installedTaskshim = `#!/bin/sh\nexec env ${env.join(" ")} '${process.execPath}' ${launch.flags.join(" ")} '${SHIM_BUNDLE}' "$@"\n`;
  const files = new Map<string, { body: string; lastModified: string }>();
  const counts = new Map<string, { full: number; notModified: number }>();
  let clock = Date.parse("2026-01-01T00:00:00Z");
  server = createServer((req, res) => {
    const path = req.url ?? "";
    const file = files.get(path);
    const count = counts.get(path) ?? { full: 0, notModified: 0 };
    counts.set(path, count);
    if (!file) {
      res.writeHead(404).end();
      return;
    }
    const etag = `"${createHash("sha256").update(file.body).digest("hex").slice(0, 20)}"`;
    const inm = req.headers["if-none-match"];
    if (inm !== undefined ? inm === etag : req.headers["if-modified-since"] === file.lastModified) {
      count.notModified += 1;
      res.writeHead(304, { etag }).end();
      return;
    }
    count.full += 1;
    res.writeHead(200, { etag, "last-modified": file.lastModified }).end(file.body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  downloads = {
    base: `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`,
    put: (path, body) => {
      clock += 60_000;
      files.set(path, { body, lastModified: new Date(clock).toUTCString() });
    },
    count: (path) => counts.get(path) ?? { full: 0, notModified: 0 },
  };
});

afterEach(async () => {
  await shim?.stop();
  shim = undefined;
  for (const home of homes.splice(0)) await rm(home, { recursive: true, force: true });
});

afterAll(() => {
  server?.closeAllConnections();
  server?.close();
});

/** A host as dstack's deploy leaves it: taskshim at the shim path, the runner, a home. */
async function host(): Promise<{ home: string; shimPath: string; runnerPath: string; bin: string }> {
  const home = await tempHome("taskshim-checks-");
  homes.push(home);
  const bin = join(home, "bin");
  await mkdir(bin);
  const shimPath = join(bin, "dstack-shim");
  const runnerPath = join(bin, "dstack-runner");
  for (const [path, body] of [
    [shimPath, installedTaskshim],
    [runnerPath, RUNNER],
  ] as const) {
    await writeFile(path, body);
    await chmod(path, 0o755);
  }
  return { home, shimPath, runnerPath, bin };
}

async function startShim(at: { home: string; shimPath: string; runnerPath: string }): Promise<ShimProcess> {
  return ShimProcess.start({
    home: at.home,
    args: ["--shim-binary-path", at.shimPath, "--runner-binary-path", at.runnerPath],
  });
}

/** The server's settings, its shim URL pointed at `shimPath` on the download server. */
const release = (shimPath: string): ReleaseServer => ({
  version: DSTACK_VERSION,
  shimDownloadUrl: `${downloads.base}${shimPath}`,
  runnerDownloadUrl: `${downloads.base}/{version}/dstack-runner-linux-{arch}`,
});

/**
 * One check, then the pause until the next: the server's checks are seconds apart, longer than
 * an install that costs a 304; here, until no component is installing.
 */
async function check(s: ShimProcess, settings: ReleaseServer): Promise<CheckRecord> {
  const record = await instanceCheck(s.url, settings);
  const deadline = Date.now() + 20_000;
  for (;;) {
    const answer = await s.request<{ components: { status: string }[] }>("GET", "/api/components");
    if (!answer.json.components.some((c) => c.status === "installing")) break;
    if (Date.now() > deadline) throw new Error(`still installing:\n${s.logs.slice(-3000)}`);
    await sleep(20);
  }
  return record;
}

const shimEntry = async (s: ShimProcess) =>
  (await s.request<{ components: { name: string }[] }>("GET", "/api/components")).json.components.find(
    (c) => c.name === "dstack-shim",
  );
const logLines = (s: ShimProcess, msg: string): number =>
  s.logs.split("\n").filter((l) => l.includes(`"msg":"${msg}"`)).length;

describe("five instance checks of a release dstack server", () => {
  it("the same bytes at the URL (what the deploy fetched): one full download, then 304s, across a restart; no rename, no restart requested", async () => {
    const started = performance.now();
    const at = await host();
    downloads.put("/taskshim", installedTaskshim);
    const settings = release("/taskshim");
    const before = await stat(at.shimPath);
    shim = await startShim(at);
    const records: CheckRecord[] = [];
    for (let i = 0; i < 3; i++) records.push(await check(shim, settings));
    // The shim restarts between two checks (systemd, a host reboot): the validators are in the home.
    await shim.stop();
    shim = await startShim(at);
    for (let i = 0; i < 2; i++) records.push(await check(shim, settings));
    expect(downloads.count("/taskshim")).toEqual({ full: 1, notModified: 4 });
    expect(records.map((r) => r.posted)).toEqual(Array.from({ length: 5 }, () => ["dstack-shim"]));
    // The installed version is the running one: the server's rule stops there.
    expect(records.map((r) => r.restart)).toEqual(
      Array.from({ length: 5 }, () => "installed version is the running one"),
    );
    const after = await stat(at.shimPath);
    expect({ ino: after.ino, mtimeMs: after.mtimeMs }).toEqual({ ino: before.ino, mtimeMs: before.mtimeMs });
    expect(await readFile(at.shimPath, "utf8")).toBe(installedTaskshim);
    const running = records[0]?.running;
    expect(await shimEntry(shim)).toEqual({
      name: "dstack-shim",
      version: running,
      status: "installed",
      build_id: expect.stringMatching(/^[0-9a-f]{20}$/) as unknown,
    });
    // The runner is the expected version: never posted, never downloaded.
    expect(downloads.count(`/${DSTACK_VERSION}/dstack-runner-linux-amd64`)).toEqual({
      full: 0,
      notModified: 0,
    });
    console.log(
      `component checks, same bytes: full ${downloads.count("/taskshim").full}, 304 ${downloads.count("/taskshim").notModified}, ` +
        `restart: ${records.map((r) => r.restart).join(" / ")}; ${Math.round(performance.now() - started)} ms`,
    );
  });

  it("new bytes published at the URL: fetched once, installed once, the new version and build id reported; the server's rule does not restart", async () => {
    const started = performance.now();
    const at = await host();
    downloads.put("/taskshim-new", installedTaskshim);
    const settings = release("/taskshim-new");
    shim = await startShim(at);
    const records: CheckRecord[] = [];
    for (let i = 0; i < 2; i++) records.push(await check(shim, settings));
    downloads.put("/taskshim-new", newerTaskshim("1.9.0"));
    const before = { ...downloads.count("/taskshim-new") };
    for (let i = 0; i < 3; i++) records.push(await check(shim, settings));
    // The same bytes as in place first (one full body, then a 304), then the new ones: one more.
    expect(before).toEqual({ full: 1, notModified: 1 });
    expect(downloads.count("/taskshim-new")).toEqual({ full: 2, notModified: 3 });
    expect(await readFile(at.shimPath, "utf8")).toBe(newerTaskshim("1.9.0"));
    expect(await shimEntry(shim)).toEqual({
      name: "dstack-shim",
      version: "1.9.0",
      status: "installed",
      build_id: "new-1.9.0",
    });
    expect(logLines(shim, "component installed")).toBe(1);
    // The installed 1.9.0 differs from the running version, but every check posts an install
    // (1.9.0 is not 0.21.3) and sets installation_requested: no restart is ever requested.
    // Checks 1-3 read the old binary (the running version); 4 and 5 read 1.9.0 and post again.
    expect(records.map((r) => r.restart)).toEqual([
      "installed version is the running one",
      "installed version is the running one",
      "installed version is the running one",
      "installation requested",
      "installation requested",
    ]);
    expect(records.at(-1)?.components.find((c) => c.name === "dstack-shim")?.version).toBe("1.9.0");
    console.log(
      `component checks, new bytes: full ${downloads.count("/taskshim-new").full} (1 before the publish), ` +
        `304 ${downloads.count("/taskshim-new").notModified}; restart: ${records.map((r) => r.restart).join(" / ")}; ` +
        `${Math.round(performance.now() - started)} ms`,
    );
  });

  it("dstack's own shim at the URL: refused, downloaded once, the taskshim in place untouched and reported, no restart requested", async () => {
    const started = performance.now();
    const at = await host();
    downloads.put("/dstack-shim-linux-amd64", GO_SHIM);
    const settings = release("/dstack-shim-linux-amd64");
    const before = await stat(at.shimPath);
    shim = await startShim(at);
    const records: CheckRecord[] = [];
    for (let i = 0; i < 5; i++) records.push(await check(shim, settings));
    expect(downloads.count("/dstack-shim-linux-amd64")).toEqual({ full: 1, notModified: 4 });
    const after = await stat(at.shimPath);
    expect({ ino: after.ino, mtimeMs: after.mtimeMs }).toEqual({ ino: before.ino, mtimeMs: before.mtimeMs });
    expect(await readFile(at.shimPath, "utf8")).toBe(installedTaskshim);
    await expect(stat(join(at.bin, "go-shim-started"))).rejects.toThrow(/ENOENT/);
    const running = records[0]?.running ?? "";
    expect(await shimEntry(shim)).toEqual({
      name: "dstack-shim",
      version: running,
      status: "installed",
      build_id: expect.stringMatching(/^[0-9a-f]{20}$/) as unknown,
      error: `refused: ${settings.shimDownloadUrl} is dstack-shim ${DSTACK_VERSION}, not taskshim (allow with --allow-shim-handover)`,
    });
    // Each check after the first saw the refusal and the binary in place, still the running version.
    expect(records.slice(1).map((r) => r.components.find((c) => c.name === "dstack-shim")?.version)).toEqual(
      Array.from({ length: 4 }, () => running),
    );
    // The refusal keeps the running taskshim reported: installed equals running, no restart.
    expect(records.map((r) => r.restart)).toEqual(
      Array.from({ length: 5 }, () => "installed version is the running one"),
    );
    expect(logLines(shim, "component install refused")).toBe(1);
    console.log(
      `component checks, dstack's shim: full ${downloads.count("/dstack-shim-linux-amd64").full}, ` +
        `304 ${downloads.count("/dstack-shim-linux-amd64").notModified}; ${Math.round(performance.now() - started)} ms ` +
        `(file at ${Math.round(performance.now() - t0)} ms)`,
    );
  });
});
