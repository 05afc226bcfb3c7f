/*
 * What a dstack server's instance checks cost: it posts the same install at every check while the
 * installed version differs from its own (always, for taskshim). Real HTTP on 127.0.0.1 that
 * counts full bodies and 304s, and real `#!/bin/sh` binaries run by the real command runner.
 */
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, readFile, rename, rm, stat, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BoundedCommandRunner, type CommandRequest, type CommandRunner } from "../exec/run-bounded.js";
import { COMPONENT_SOURCES_FILE, MAX_SOURCES_FILE_BYTES } from "./component-sources.js";
import { ComponentService, type ComponentInfo, type ComponentServiceOptions } from "./component-service.js";

/** A taskshim binary: `--version`, and `version --json` with a build id. */
const taskshim = (version: string): string =>
  [
    "#!/bin/sh",
    `if [ "$1" = "--version" ]; then echo "taskshim version ${version}"; exit 0; fi`,
    `if [ "$1" = "version" ] && [ "$2" = "--json" ]; then echo '{"version":"${version}","build_id":"b-${version}"}'; exit 0; fi`,
    "exit 2",
    "",
  ].join("\n");

/**
 * A stand-in for dstack's Go dstack-shim (the real one is a 30 MB Go binary): it prints its
 * version line, and given anything else it would start serving, which this one records in a
 * file beside itself so a test can tell it was never asked.
 */
const goShim = (version: string): string =>
  [
    "#!/bin/sh",
    `if [ "$1" = "--version" ]; then echo "dstack-shim version ${version}"; exit 0; fi`,
    'echo "$@" >> "$(dirname "$0")/go-shim-started"',
    "exit 0",
    "",
  ].join("\n");

/** A stand-in for dstack's dstack-runner. */
const runner = (version: string): string =>
  `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "dstack-runner version ${version}"; exit 0; fi\nexit 2\n`;

const sha = (text: string): string => createHash("sha256").update(text).digest("hex");

/** The download server: one file per path, validators (or none), and what it sent. */
interface Origin {
  readonly files: Map<string, { body: string; lastModified: string }>;
  /** Send ETag and Last-Modified (and answer conditional requests with 304). */
  validators: boolean;
  /** 200s with a body, 304s. */
  full: number;
  notModified: number;
  url(path: string): string;
  /** Serves `body` at `path`, as a new file (a later Last-Modified than the one before). */
  put(path: string, body: string): void;
}

/** Runs commands for real and remembers their argv. */
class CountingRunner implements CommandRunner {
  readonly argvs: string[][] = [];
  private readonly inner = new BoundedCommandRunner();
  run(request: CommandRequest): ReturnType<CommandRunner["run"]> {
    this.argvs.push([...request.argv]);
    return this.inner.run(request);
  }
}

let dir: string;
let server: Server;
let origin: Origin;
let commands: CountingRunner;
let logs: { level: number; msg: string; [key: string]: unknown }[];
let shimPath: string;
let runnerPath: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-checks-"));
  await mkdir(join(dir, "bin"));
  shimPath = join(dir, "bin", "dstack-shim");
  runnerPath = join(dir, "bin", "dstack-runner");
  commands = new CountingRunner();
  logs = [];
  let clock = Date.parse("2026-01-01T00:00:00Z");
  const files = new Map<string, { body: string; lastModified: string }>();
  server = createServer((req, res) => {
    const file = files.get(req.url ?? "");
    if (!file) {
      res.writeHead(404).end();
      return;
    }
    const etag = `"${sha(file.body).slice(0, 16)}"`;
    if (origin.validators) {
      // RFC 9110: If-None-Match decides when present; If-Modified-Since only without it.
      const inm = req.headers["if-none-match"];
      const ims = req.headers["if-modified-since"];
      if (inm !== undefined ? inm === etag : ims === file.lastModified) {
        origin.notModified += 1;
        res.writeHead(304, { etag }).end();
        return;
      }
    }
    origin.full += 1;
    res.writeHead(200, origin.validators ? { etag, "last-modified": file.lastModified } : {}).end(file.body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  origin = {
    files,
    validators: true,
    full: 0,
    notModified: 0,
    url: (path) => `http://127.0.0.1:${port}${path}`,
    put: (path, body) => {
      clock += 60_000;
      files.set(path, { body, lastModified: new Date(clock).toUTCString() });
    },
  };
});

afterEach(async () => {
  server.closeAllConnections();
  server.close();
  await rm(dir, { recursive: true, force: true });
});

/** A service on the test's home, logging into `logs`. */
function service(options: ComponentServiceOptions = {}): ComponentService {
  const log = pino(
    { level: "debug" },
    { write: (line: string) => void logs.push(JSON.parse(line) as (typeof logs)[number]) },
  );
  return new ComponentService(
    { runner: runnerPath, shim: shimPath },
    commands,
    log,
    new AbortController().signal,
    {
      home: dir,
      ...options,
    },
  );
}

/** Posts one install and waits for its end, as a check then reads `GET /api/components`. */
async function post(
  svc: ComponentService,
  name: ComponentInfo["name"],
  url: string,
  sha256?: string,
): Promise<void> {
  svc.install(name, url, sha256);
  await svc.settle();
}

async function entry(svc: ComponentService, name: ComponentInfo["name"]): Promise<ComponentInfo> {
  const found = (await svc.list()).find((c) => c.name === name);
  if (!found) throw new Error(`no entry ${name}`);
  return found;
}

async function put(path: string, content: string): Promise<void> {
  await writeFile(path, content);
  await chmod(path, 0o755);
}

const inode = async (path: string): Promise<number> => (await stat(path)).ino;
const lines = (level: "debug" | "info" | "warn" | "error", msg: string) => {
  const n = { debug: 20, info: 30, warn: 40, error: 50 }[level];
  return logs.filter((l) => l.level === n && l.msg === msg);
};
const REFUSED = (url: string) =>
  `refused: ${url} is dstack-shim 0.21.3, not taskshim (allow with --allow-shim-handover)`;

describe("the same bytes at the same URL", () => {
  it("five posts: one full body, then 304s; installed once, the target's inode unchanged, nothing run again", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    const svc = service();
    await svc.refresh();
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    const ino = await inode(shimPath);
    const ranAfterInstall = commands.argvs.length;
    for (let i = 0; i < 4; i++) await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 4 });
    expect(await inode(shimPath)).toBe(ino);
    expect(await readFile(shimPath, "utf8")).toBe(taskshim("1.4.0"));
    // A 304 runs nothing: no --version of the binary in place at every check.
    expect(commands.argvs.length).toBe(ranAfterInstall);
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "b-1.4.0",
    });
    expect(lines("info", "component installed")).toHaveLength(1);
    expect(lines("debug", "component unchanged at its source")).toHaveLength(4);
  });

  it("new bytes at that URL: exactly one more full body, installed once, the new version and build id reported", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    const svc = service();
    for (let i = 0; i < 3; i++) await post(svc, "dstack-shim", origin.url("/taskshim"));
    const ino = await inode(shimPath);
    origin.put("/taskshim", taskshim("1.5.0"));
    for (let i = 0; i < 3; i++) await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 4 });
    expect(await inode(shimPath)).not.toBe(ino);
    expect(await readFile(shimPath, "utf8")).toBe(taskshim("1.5.0"));
    expect(lines("info", "component installed").map((l) => l.version)).toEqual(["1.4.0", "1.5.0"]);
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.5.0",
      status: "installed",
      build_id: "b-1.5.0",
    });
  });

  it("the first check after dstack's deploy (that very file already in place, nothing remembered): a 200 is not renamed over it, and the next post costs a 304", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    await put(shimPath, taskshim("1.4.0"));
    const svc = service();
    await svc.refresh();
    const ino = await inode(shimPath);
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect(await inode(shimPath)).toBe(ino);
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "b-1.4.0",
    });
    expect(lines("info", "component download is the binary in place; kept")).toHaveLength(1);
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 1 });
    expect(await inode(shimPath)).toBe(ino);
  });

  it("a download server without validators costs a full download each time, and still renames nothing", async () => {
    origin.validators = false;
    origin.put("/taskshim", taskshim("1.4.0"));
    const svc = service();
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    const ino = await inode(shimPath);
    for (let i = 0; i < 2; i++) await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 3, notModified: 0 });
    expect(await inode(shimPath)).toBe(ino);
    expect(lines("info", "component installed")).toHaveLength(1);
    // The binary in place is news once, not at every check.
    expect(lines("info", "component download is the binary in place; kept")).toHaveLength(1);
    expect((await entry(svc, "dstack-shim")).version).toBe("1.4.0");
  });

  it("a target replaced behind the shim's back is not taken for the installed one: no conditional request, a full download", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    const svc = service();
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    await put(join(dir, "other"), taskshim("1.3.0"));
    execFileSync("mv", [join(dir, "other"), shimPath]);
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 0 });
    expect(await readFile(shimPath, "utf8")).toBe(taskshim("1.4.0"));
    expect((await entry(svc, "dstack-shim")).version).toBe("1.4.0");
  });

  it("the request's sha256: the remembered bytes' digest costs a 304; another digest a full download and a mismatch", async () => {
    const body = taskshim("1.4.0");
    origin.put("/taskshim", body);
    const svc = service();
    await post(svc, "dstack-shim", origin.url("/taskshim"), sha(body));
    await post(svc, "dstack-shim", origin.url("/taskshim"), sha(body));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 1 });
    await post(svc, "dstack-shim", origin.url("/taskshim"), "0".repeat(64));
    expect(origin.full).toBe(2);
    expect(await entry(svc, "dstack-shim")).toMatchObject({
      status: "installed",
      version: "1.4.0",
      error: `sha256 mismatch: expected ${"0".repeat(64)}, got ${sha(body)}`,
    });
    // The mismatch is remembered with the digest asked for: the same request again costs a 304.
    await post(svc, "dstack-shim", origin.url("/taskshim"), "0".repeat(64));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 2 });
    expect((await entry(svc, "dstack-shim")).error).toMatch(/^sha256 mismatch/);
  });

  it("a file: URL is compared by the source file's identity: unchanged costs no read, a rewrite is installed", async () => {
    const source = join(dir, "taskshim-file");
    await writeFile(source, taskshim("1.4.0"));
    const svc = service();
    await post(svc, "dstack-shim", `file://${source}`);
    const ino = await inode(shimPath);
    await post(svc, "dstack-shim", `file://${source}`);
    expect(lines("debug", "component unchanged at its source").map((l) => l.why)).toEqual(["not-modified"]);
    expect(await inode(shimPath)).toBe(ino);
    await writeFile(source, taskshim("1.4.1"));
    await post(svc, "dstack-shim", `file://${source}`);
    expect((await entry(svc, "dstack-shim")).version).toBe("1.4.1");
  });
});

describe("a dstack-shim that is not taskshim", () => {
  it("dstack's shim is refused: the taskshim in place untouched and still reported installed, the refusal in list() and logged once, repeated posts cost 304s", async () => {
    await put(shimPath, taskshim("1.4.0"));
    origin.put("/dstack-shim", goShim("0.21.3"));
    const svc = service();
    await svc.refresh();
    const ino = await inode(shimPath);
    for (let i = 0; i < 5; i++) await post(svc, "dstack-shim", origin.url("/dstack-shim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 4 });
    expect(await inode(shimPath)).toBe(ino);
    expect(await readFile(shimPath, "utf8")).toBe(taskshim("1.4.0"));
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "b-1.4.0",
      error: REFUSED(origin.url("/dstack-shim")),
    });
    expect(lines("warn", "component install refused")).toHaveLength(1);
    expect(lines("debug", "component install refused (again)")).toHaveLength(4);
    // Asked for its --version only: given anything else dstack's shim would start serving.
    expect(commands.argvs.filter((a) => a[0]?.includes(".download-")).map((a) => a.slice(1))).toEqual([
      ["--version"],
    ]);
    await expect(stat(join(dir, "bin", "go-shim-started"))).rejects.toThrow(/ENOENT/);
  });

  it("with allowShimHandover, dstack's shim is installed as today", async () => {
    await put(shimPath, taskshim("1.4.0"));
    origin.put("/dstack-shim", goShim("0.21.3"));
    const svc = service({ allowShimHandover: true });
    await svc.refresh();
    await post(svc, "dstack-shim", origin.url("/dstack-shim"));
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "0.21.3",
      status: "installed",
    });
    expect(await readFile(shimPath, "utf8")).toBe(goShim("0.21.3"));
    await expect(stat(join(dir, "bin", "go-shim-started"))).rejects.toThrow(/ENOENT/);
    await post(svc, "dstack-shim", origin.url("/dstack-shim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 1 });
  });

  it("a refusal remembered, then handover allowed: the next post downloads in full and installs", async () => {
    await put(shimPath, taskshim("1.4.0"));
    origin.put("/dstack-shim", goShim("0.21.3"));
    await post(service(), "dstack-shim", origin.url("/dstack-shim"));
    const allowed = service({ allowShimHandover: true });
    await allowed.refresh();
    await post(allowed, "dstack-shim", origin.url("/dstack-shim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 0 });
    expect(await entry(allowed, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "0.21.3",
      status: "installed",
    });
  });

  it("a dstack-runner offered as dstack-shim is refused as before (not this component's binary), and remembered", async () => {
    origin.put("/runner", runner("0.21.3"));
    const svc = service({ allowShimHandover: true });
    for (let i = 0; i < 2; i++) await post(svc, "dstack-shim", origin.url("/runner"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 1 });
    expect(await entry(svc, "dstack-shim")).toMatchObject({
      status: "not-installed",
      error: expect.stringMatching(
        /^the download is not a dstack-shim binary: it is dstack-runner/,
      ) as unknown,
    });
  });
});

describe("dstack-runner", () => {
  it("follows the same download rules (fetched once, then 304s; new bytes once), without the taskshim rule", async () => {
    origin.put("/runner", runner("0.21.3"));
    const svc = service();
    for (let i = 0; i < 3; i++) await post(svc, "dstack-runner", origin.url("/runner"));
    const ino = await inode(runnerPath);
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 2 });
    origin.put("/runner", runner("0.21.4"));
    for (let i = 0; i < 2; i++) await post(svc, "dstack-runner", origin.url("/runner"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 3 });
    expect(await inode(runnerPath)).not.toBe(ino);
    expect(await entry(svc, "dstack-runner")).toEqual({
      name: "dstack-runner",
      version: "0.21.4",
      status: "installed",
    });
  });
});

describe("the sources file in the home", () => {
  it("a restart (a new service on the same home) asks with the remembered validators: 304, not a full download", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    origin.put("/dstack-shim", goShim("0.21.3"));
    origin.put("/runner", runner("0.21.3"));
    const first = service();
    await post(first, "dstack-shim", origin.url("/taskshim"));
    await post(first, "dstack-runner", origin.url("/runner"));
    await post(first, "dstack-shim", origin.url("/dstack-shim"));
    expect(origin.full).toBe(3);
    const file = await stat(join(dir, COMPONENT_SOURCES_FILE));
    expect(file.mode & 0o777).toBe(0o600);
    logs = [];
    const restarted = service();
    await restarted.refresh();
    await post(restarted, "dstack-runner", origin.url("/runner"));
    await post(restarted, "dstack-shim", origin.url("/dstack-shim"));
    await post(restarted, "dstack-shim", origin.url("/dstack-shim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 3, notModified: 3 });
    expect(await entry(restarted, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "b-1.4.0",
      error: REFUSED(origin.url("/dstack-shim")),
    });
    // A new process says it once more (its log starts empty), then no more.
    expect(lines("warn", "component install refused")).toHaveLength(1);
    expect(logs.filter((l) => l.level >= 40 && l.msg !== "component install refused")).toEqual([]);
    // The file keeps no URL secrets: the URL's sha256 matches, the URL itself is redacted.
    await post(restarted, "dstack-runner", `${origin.url("/runner")}?X-Amz-Signature=deadbeef`);
    expect(await readFile(join(dir, COMPONENT_SOURCES_FILE), "utf8")).not.toContain("deadbeef");
  });

  const hostile: [string, () => Promise<void>][] = [
    ["corrupt (not JSON)", () => writeFile(join(dir, COMPONENT_SOURCES_FILE), "{ not json")],
    [
      "of another schema",
      () =>
        writeFile(
          join(dir, COMPONENT_SOURCES_FILE),
          JSON.stringify({ format: 1, components: { "dstack-shim": 7 } }),
        ),
    ],
    [
      "larger than the cap",
      () =>
        writeFile(
          join(dir, COMPONENT_SOURCES_FILE),
          `{"format":1,"components":{},"x":"${"a".repeat(MAX_SOURCES_FILE_BYTES)}"}`,
        ),
    ],
    [
      "a symlink (to a valid file)",
      async () => {
        await rename(join(dir, COMPONENT_SOURCES_FILE), join(dir, "elsewhere.json"));
        await symlink(join(dir, "elsewhere.json"), join(dir, COMPONENT_SOURCES_FILE));
      },
    ],
    [
      "a FIFO",
      async () => {
        await rm(join(dir, COMPONENT_SOURCES_FILE));
        execFileSync("mkfifo", [join(dir, COMPONENT_SOURCES_FILE)]);
      },
    ],
  ];
  for (const [what, spoil] of hostile) {
    it(`a sources file ${what} is ignored with one warning: the next install downloads in full and succeeds`, async () => {
      origin.put("/taskshim", taskshim("1.4.0"));
      origin.put("/runner", runner("0.21.3"));
      await post(service(), "dstack-shim", origin.url("/taskshim"));
      await spoil();
      logs = [];
      const svc = service();
      await svc.refresh();
      await post(svc, "dstack-shim", origin.url("/taskshim"));
      await post(svc, "dstack-runner", origin.url("/runner"));
      expect(origin.full).toBe(3);
      expect(
        lines("warn", "component sources file ignored; the next install of each component downloads in full"),
      ).toHaveLength(1);
      expect((await entry(svc, "dstack-shim")).status).toBe("installed");
      expect((await entry(svc, "dstack-runner")).status).toBe("installed");
    });
  }

  it("temp files of a write a crash cut short are removed when the file is first read", async () => {
    const stale = join(dir, `.${COMPONENT_SOURCES_FILE}.tmp-4242-1`);
    await writeFile(stale, "{");
    origin.put("/taskshim", taskshim("1.4.0"));
    await post(service(), "dstack-shim", origin.url("/taskshim"));
    await expect(stat(stale)).rejects.toThrow(/ENOENT/);
    expect(JSON.parse(await readFile(join(dir, COMPONENT_SOURCES_FILE), "utf8"))).toMatchObject({
      format: 1,
      components: { "dstack-shim": { verdict: { kind: "installed", version: "1.4.0" } } },
    });
  });

  it("a sources file that cannot be written: the install still succeeds, the failure is logged", async () => {
    // A directory where the file goes: the rename over it fails, as a read-only home would.
    await mkdir(join(dir, COMPONENT_SOURCES_FILE));
    origin.put("/taskshim", taskshim("1.4.0"));
    const svc = service();
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect(await entry(svc, "dstack-shim")).toMatchObject({ status: "installed", version: "1.4.0" });
    expect(await entry(svc, "dstack-shim")).not.toHaveProperty("error");
    expect(
      lines(
        "warn",
        "cannot write the component sources file; after a restart, the next install of each component downloads in full",
      ),
    ).toHaveLength(1);
    // Still remembered in memory: the next post costs a 304.
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 1 });
  });
});

describe("what an install logs and remembers", () => {
  const failing = "#!/bin/sh\nexit 3\n";
  const page = "<!doctype html><html>sign in</html>\n";
  const downloadRuns = (): string[][] => commands.argvs.filter((a) => a[0]?.includes(".download-") === true);

  it("logs an install once at info with the version, and the build id of a taskshim only", async () => {
    origin.put("/taskshim", taskshim("1.4.0"));
    origin.put("/runner", runner("0.21.3"));
    const svc = service();
    await post(svc, "dstack-shim", origin.url("/taskshim"));
    await post(svc, "dstack-runner", origin.url("/runner"));
    expect(
      lines("info", "component installed").map(({ component, version, build_id }) => ({
        component,
        version,
        build_id,
      })),
    ).toEqual([
      { component: "dstack-shim", version: "1.4.0", build_id: "b-1.4.0" },
      { component: "dstack-runner", version: "0.21.3", build_id: undefined },
    ]);
    expect(lines("info", "component installed")[1]).not.toHaveProperty("build_id");
  });

  it("a --version that cannot run is a failure, not a verdict: logged each time, nothing remembered, the next post downloads and runs it again", async () => {
    origin.put("/broken", failing);
    const svc = service();
    await post(svc, "dstack-runner", origin.url("/broken"));
    await post(svc, "dstack-runner", origin.url("/broken"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 0 });
    expect(downloadRuns().map((a) => a.slice(1))).toEqual([["--version"], ["--version"]]);
    expect(await entry(svc, "dstack-runner")).toEqual({
      name: "dstack-runner",
      version: "",
      status: "not-installed",
      error: "the download is not a dstack-runner binary: --version: exit status 3",
    });
    const failed = lines("error", "component install failed");
    expect(failed).toHaveLength(2);
    expect(failed[0]).toMatchObject({
      component: "dstack-runner",
      url: origin.url("/broken"),
      in_place: { status: "not-installed", version: "" },
    });
    await expect(stat(join(dir, COMPONENT_SOURCES_FILE))).rejects.toThrow(/ENOENT/);
  });

  it("content that is not a binary is a verdict: logged as a failure once, then at debug, and the next posts cost 304s", async () => {
    origin.put("/page", page);
    await put(runnerPath, runner("0.21.3"));
    const svc = service();
    await svc.refresh();
    const ranBefore = commands.argvs.length;
    for (let i = 0; i < 3; i++) await post(svc, "dstack-runner", origin.url("/page"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 1, notModified: 2 });
    // Neither the page nor the binary in place is run: the binary in place is as it was seen.
    expect(commands.argvs.length).toBe(ranBefore);
    const error = "the download is not a dstack-runner binary: neither an ELF executable nor a #! script";
    expect(await entry(svc, "dstack-runner")).toEqual({
      name: "dstack-runner",
      version: "0.21.3",
      status: "installed",
      error,
    });
    expect(lines("error", "component install failed")).toHaveLength(1);
    expect(lines("error", "component install failed")[0]).toMatchObject({
      in_place: { status: "installed", version: "0.21.3" },
    });
    expect(lines("debug", "component install failed (again)").map((l) => l.error)).toEqual([error, error]);
    expect(lines("warn", "component install refused")).toEqual([]);
  });

  it("without validators, bytes refused before are downloaded again but never run again; new bytes are judged anew", async () => {
    origin.validators = false;
    origin.put("/shim", runner("0.21.3"));
    const svc = service();
    for (let i = 0; i < 3; i++) await post(svc, "dstack-shim", origin.url("/shim"));
    expect(origin.full).toBe(3);
    expect(downloadRuns()).toHaveLength(1);
    expect(await entry(svc, "dstack-shim")).toMatchObject({
      status: "not-installed",
      error:
        'the download is not a dstack-shim binary: it is dstack-runner (--version printed "dstack-runner version 0.21.3")',
    });
    origin.put("/shim", taskshim("1.4.0"));
    await post(svc, "dstack-shim", origin.url("/shim"));
    expect(await entry(svc, "dstack-shim")).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "b-1.4.0",
    });
  });

  it("a refusal at a URL does not stand for the same bytes at another URL, nor for new bytes at that URL", async () => {
    origin.put("/a", page);
    origin.put("/b", page);
    const svc = service();
    await post(svc, "dstack-runner", origin.url("/a"));
    await post(svc, "dstack-runner", origin.url("/b"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 0 });
    expect(lines("error", "component install failed")).toHaveLength(2);
    origin.put("/b", runner("0.21.4"));
    await post(svc, "dstack-runner", origin.url("/b"));
    expect(await entry(svc, "dstack-runner")).toEqual({
      name: "dstack-runner",
      version: "0.21.4",
      status: "installed",
    });
  });

  it("a sha256 mismatch is remembered with the digest asked: another digest, or none, downloads in full", async () => {
    const body = runner("0.21.3");
    origin.put("/runner", body);
    const svc = service();
    await post(svc, "dstack-runner", origin.url("/runner"), "1".repeat(64));
    await post(svc, "dstack-runner", origin.url("/runner"), "2".repeat(64));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 2, notModified: 0 });
    expect((await entry(svc, "dstack-runner")).error).toBe(
      `sha256 mismatch: expected ${"2".repeat(64)}, got ${sha(body)}`,
    );
    expect(downloadRuns()).toEqual([]);
    await post(svc, "dstack-runner", origin.url("/runner"));
    expect({ full: origin.full, notModified: origin.notModified }).toEqual({ full: 3, notModified: 0 });
    expect(await entry(svc, "dstack-runner")).toEqual({
      name: "dstack-runner",
      version: "0.21.3",
      status: "installed",
    });
  });

  it("a Go dstack-shim refused is logged as a refusal (warn), with the URL redacted", async () => {
    // The server's files are keyed by the whole request URL, query included.
    origin.put("/dstack-shim?token=s3cret", goShim("0.21.3"));
    const svc = service();
    await post(svc, "dstack-shim", `${origin.url("/dstack-shim")}?token=s3cret`);
    const refusal = lines("warn", "component install refused");
    expect(refusal).toHaveLength(1);
    expect(refusal[0]).toMatchObject({ component: "dstack-shim", url: origin.url("/dstack-shim") });
    expect(JSON.stringify(logs)).not.toContain("s3cret");
    expect((await entry(svc, "dstack-shim")).error).toBe(REFUSED(origin.url("/dstack-shim")));
  });
});
