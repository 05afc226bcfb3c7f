import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { closeSync, constants, openSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BoundedCommandRunner, CommandLaunchError, type BoundedOutcome } from "../exec/run-bounded.js";
import { exited, FakeCommandRunner } from "../testing/fake-command-runner.js";
import { waitFor } from "../testing/wait-for.js";
import { ComponentRequestError, ComponentService, type ComponentInfo } from "./component-service.js";

const script = (version: string): string => `#!/bin/sh\necho "dstack-runner version ${version}"\n`;
const sha = (text: string): string => createHash("sha256").update(text).digest("hex");

let dir: string;
let server: Server;
let baseUrl: string;
let downloads: number;
let gate: Promise<void> | undefined;
let service: ComponentService;

async function waitStatus(name: "dstack-runner" | "dstack-shim", status: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (Date.now() < deadline) {
    const found = (await service.list()).find((c) => c.name === name);
    if (found?.status === status) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`component ${name} never reached ${status}: ${JSON.stringify(await service.list())}`);
}

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-components-"));
  downloads = 0;
  gate = undefined;
  server = createServer((req, res) => {
    downloads += 1;
    void (async () => {
      await gate;
      if (req.url === "/page.html") {
        // A login wall or error page some CDNs serve with 200 instead of the file.
        res.writeHead(200, { "content-type": "text/html" }).end("<!doctype html><html>sign in</html>\n");
        return;
      }
      if (req.url === "/stall") {
        // Headers and a first chunk, then nothing: a peer that stalls mid-body.
        res.writeHead(200).write("#!/bin/sh\n");
        return;
      }
      const version = /\/runner-(.+)$/.exec(req.url ?? "")?.[1];
      if (!version) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200).end(script(version));
    })();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  baseUrl = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  service = new ComponentService(
    { runner: join(dir, "dstack-runner"), shim: join(dir, "dstack-shim") },
    new BoundedCommandRunner(),
    pino({ level: "silent" }),
    new AbortController().signal,
  );
});

afterEach(async () => {
  server.closeAllConnections();
  server.close();
  await rm(dir, { recursive: true, force: true });
});

describe("ComponentService", () => {
  it("reports binaries that are missing as not-installed", async () => {
    await service.refresh();
    expect(await service.list()).toEqual([
      { name: "dstack-runner", version: "", status: "not-installed" },
      { name: "dstack-shim", version: "", status: "not-installed" },
    ]);
  });

  it("installs over http with a verified sha256, mode 0755, and reports the new version", async () => {
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, sha(script("0.19.40")));
    await waitStatus("dstack-runner", "installed");
    expect((await service.list())[0]).toEqual({
      name: "dstack-runner",
      version: "0.19.40",
      status: "installed",
    });
    expect((await stat(join(dir, "dstack-runner"))).mode & 0o777).toBe(0o755);
    expect((await readdir(dir)).filter((n) => n.includes("download"))).toEqual([]);
  });

  it("installs from a file URL", async () => {
    const source = join(dir, "source-runner");
    await writeFile(source, script("0.20.1"));
    service.install("dstack-runner", `file://${source}`, undefined);
    await waitStatus("dstack-runner", "installed");
    expect((await service.list())[0]?.version).toBe("0.20.1");
  });

  it("U14 leaves the old binary untouched on a sha256 mismatch and reports it as installed, with the failure in error", async () => {
    const target = join(dir, "dstack-runner");
    await writeFile(target, script("0.19.1"));
    await chmod(target, 0o755);
    await service.refresh();
    service.install("dstack-runner", `${baseUrl}/runner-0.19.2`, "0".repeat(64));
    await service.settle();
    expect(await readFile(target, "utf8")).toBe(script("0.19.1"));
    expect((await readdir(dir)).filter((n) => n.includes("download"))).toEqual([]);
    expect((await service.list())[0]).toEqual({
      name: "dstack-runner",
      version: "0.19.1",
      status: "installed",
      error: expect.stringMatching(/^sha256 mismatch: expected 0{64}, got [0-9a-f]{64}$/) as unknown,
    });
  });

  it("answers a second install while one runs with a busy (409) error", async () => {
    let open!: () => void;
    gate = new Promise((resolve) => (open = resolve));
    service.install("dstack-runner", `${baseUrl}/runner-1.0.0`, undefined);
    expect(() => service.install("dstack-runner", `${baseUrl}/runner-1.0.0`, undefined)).toThrow(
      expect.objectContaining({ kind: "busy", message: "already installing" }),
    );
    open();
    await waitStatus("dstack-runner", "installed");
  });

  it("installs the same URL again from a server without validators (every byte sent again), but renames nothing over the same bytes (upstream #3953)", async () => {
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, undefined);
    await waitStatus("dstack-runner", "installed");
    const ino = (await stat(join(dir, "dstack-runner"))).ino;
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, undefined);
    await waitStatus("dstack-runner", "installed");
    // This server sends no ETag or Last-Modified: nothing to ask with (component-checks.test.ts
    // covers the 304s of one that does).
    expect(downloads).toBe(2);
    expect((await stat(join(dir, "dstack-runner"))).ino).toBe(ino);
  });

  it("rejects bad requests with the wire's messages", () => {
    const invalid = (name: unknown, url: unknown, sha256?: unknown) => {
      try {
        service.install(name, url, sha256);
      } catch (error) {
        expect(error).toBeInstanceOf(ComponentRequestError);
        return (error as ComponentRequestError).message;
      }
      return "accepted";
    };
    expect(invalid("", "http://x")).toBe("empty name");
    expect(invalid("dstack-gateway", "http://x")).toBe("unknown component");
    expect(invalid("dstack-runner", "")).toBe("empty url");
    expect(invalid("dstack-runner", "ftp://x/y")).toMatch(/unsupported url scheme/);
    expect(invalid("dstack-runner", "http://x", "abc")).toMatch(/sha256/);
  });

  it("takes a name and a URL as non-empty strings, each component by its name", async () => {
    const invalid = (name: unknown, url: unknown): unknown => {
      try {
        service.install(name, url, undefined);
      } catch (error) {
        return { kind: (error as ComponentRequestError).kind, message: (error as Error).message };
      }
      return "accepted";
    };
    expect(invalid(undefined, "http://x")).toEqual({ kind: "invalid", message: "empty name" });
    expect(invalid(7, "http://x")).toEqual({ kind: "invalid", message: "empty name" });
    expect(invalid("", "http://x")).toEqual({ kind: "invalid", message: "empty name" });
    expect(invalid("dstack-runner ", "http://x")).toEqual({ kind: "invalid", message: "unknown component" });
    expect(invalid("taskshim", "http://x")).toEqual({ kind: "invalid", message: "unknown component" });
    expect(invalid("dstack-runner", undefined)).toEqual({ kind: "invalid", message: "empty url" });
    expect(invalid("dstack-runner", 7)).toEqual({ kind: "invalid", message: "empty url" });
    expect(invalid("dstack-shim", "")).toEqual({ kind: "invalid", message: "empty url" });
    expect(invalid("dstack-shim", "not a url")).toEqual({ kind: "invalid", message: "invalid url" });
    expect(invalid("dstack-shim", "/relative/path")).toEqual({ kind: "invalid", message: "invalid url" });
    expect(invalid("dstack-runner", `file://${join(dir, "none")}`)).toBe("accepted");
    expect(invalid("dstack-shim", `file://${join(dir, "none")}`)).toBe("accepted");
    await service.settle();
  });

  it("accepts http, https and file URLs (any case), and refuses every other scheme, saying which it takes", async () => {
    const outcome = async (url: string): Promise<string> => {
      try {
        service.install("dstack-runner", url, undefined);
      } catch (error) {
        return (error as Error).message;
      }
      await service.settle();
      return "accepted";
    };
    // Nothing listens on port 1: each accepted install fails at once.
    for (const url of [
      "http://127.0.0.1:1/r",
      "https://127.0.0.1:1/r",
      "HTTP://127.0.0.1:1/r",
      `file://${dir}/x`,
    ]) {
      expect(await outcome(url), url).toBe("accepted");
    }
    for (const url of [
      "ftp://x/y",
      "data:,hello",
      "javascript:alert(1)",
      "ws://x/y",
      "httpx://x/y",
      "file+x://y/z",
    ]) {
      expect(await outcome(url), url).toBe("unsupported url scheme (http, https or file)");
    }
  });

  it("takes a sha256 of exactly 64 hex digits in either case, or none (undefined or null)", async () => {
    const hex = "0123456789abcdef".repeat(4);
    const outcome = async (sha256: unknown): Promise<string> => {
      try {
        service.install("dstack-runner", `file://${dir}/x`, sha256);
      } catch (error) {
        expect(error).toMatchObject({ kind: "invalid" });
        return (error as Error).message;
      }
      await service.settle();
      return "accepted";
    };
    for (const ok of [undefined, null, hex, hex.toUpperCase(), "f".repeat(64)]) {
      expect(await outcome(ok), String(ok)).toBe("accepted");
    }
    for (const bad of [
      hex.slice(1),
      `${hex}0`,
      `x${hex}`,
      `${hex}x`,
      ` ${hex}`,
      `${hex.slice(1)}g`,
      "",
      7,
      { sha256: hex },
    ]) {
      expect(await outcome(bad), JSON.stringify(bad)).toBe("sha256 must be 64 hex digits");
    }
  });

  it("compares a sha256 given in upper case with the download's (lower case) digest", async () => {
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, sha(script("0.19.40")).toUpperCase());
    await service.settle();
    expect((await service.list())[0]).toEqual({
      name: "dstack-runner",
      version: "0.19.40",
      status: "installed",
    });
    service.install("dstack-runner", `${baseUrl}/runner-0.19.41`, "A".repeat(64));
    await service.settle();
    expect((await service.list())[0]?.error).toBe(
      `sha256 mismatch: expected ${"a".repeat(64)}, got ${sha(script("0.19.41"))}`,
    );
  });

  it("an accepted install shows `installing` at once: the version, build id and last error cleared", async () => {
    service.install("dstack-runner", `${baseUrl}/missing`, undefined);
    await service.settle();
    expect((await service.list())[0]).toEqual({
      name: "dstack-runner",
      version: "",
      status: "not-installed",
      error: "download failed: HTTP 404",
    });
    let open!: () => void;
    gate = new Promise((resolve) => (open = resolve));
    service.install("dstack-runner", `${baseUrl}/runner-1.0.0`, undefined);
    expect((await service.list())[0]).toEqual({ name: "dstack-runner", version: "", status: "installing" });
    expect(service.missingRunner()).toBeUndefined();
    open();
    await service.settle();
    expect(service.missingRunner()).toBeUndefined();
    await rm(join(dir, "dstack-runner"));
    expect(service.missingRunner()).toBe(join(dir, "dstack-runner"));
  });
});

/** A binary as the fake executor reads it: `--version` prints `line`; `version --json` prints `json` when given. */
const binary = (line: string, json?: object): string =>
  `#!/bin/sh\necho "${line}"\n${json ? `# version-json: ${JSON.stringify(json)}\n` : ""}`;

/** One command the fake executor ran: its argv, and the file's mode and content when it was run. */
interface Run {
  readonly argv: readonly string[];
  readonly mode: number;
  readonly content: string;
  /** The content of {@link FakeExecutor.watched} at that moment (undefined: no such file). */
  readonly watchedContent: string | undefined;
}

/**
 * A `FakeCommandRunner` that "executes" the files the tests write, as the kernel and a shell
 * would: a file without an execute bit fails to launch (EACCES), one without `#!` too (ENOEXEC);
 * a script prints its `echo` line for `--version`, and its `# version-json:` line (else exits 1,
 * as an older taskshim without the command would) for `version --json`.
 */
class FakeExecutor {
  readonly runner = new FakeCommandRunner();
  readonly runs: Run[] = [];
  /** A file whose content every run records (the install's target). */
  watched: string | undefined;
  private readonly held = new Map<string, Promise<void>>();

  constructor() {
    this.runner.script = (argv) => this.exec(argv);
  }

  /**
   * The next `--version` of `path` answers only once the returned function is called, with what
   * the file held when it was run (a process keeps the inode it was started from).
   */
  hold(path: string): () => void {
    let release!: () => void;
    this.held.set(path, new Promise<void>((resolve) => (release = resolve)));
    return release;
  }

  /** The runs of `<path> version --json`. */
  jsonRuns(): Run[] {
    return this.runs.filter((r) => r.argv[1] === "version");
  }

  private async exec(argv: readonly string[]): Promise<BoundedOutcome> {
    const [path = "", ...args] = argv;
    let mode: number;
    let content: string;
    try {
      mode = (await stat(path)).mode & 0o777;
      content = await readFile(path, "utf8");
    } catch (error) {
      throw new CommandLaunchError(`cannot start ${path}: spawn ENOENT`, { cause: error });
    }
    const watchedContent = this.watched
      ? await readFile(this.watched, "utf8").catch(() => undefined)
      : undefined;
    this.runs.push({ argv, mode, content, watchedContent });
    const gate = args[0] === "--version" ? this.held.get(path) : undefined;
    if (gate) {
      this.held.delete(path);
      await gate;
    }
    if ((mode & 0o111) === 0) throw new CommandLaunchError(`cannot start ${path}: spawn EACCES`);
    if (!content.startsWith("#!")) throw new CommandLaunchError(`cannot start ${path}: spawn ENOEXEC`);
    const line = /^echo "(.*)"$/m.exec(content)?.[1];
    if (args[0] === "--version") return line === undefined ? exited(2) : exited(0, `${line}\n`);
    if (args[0] === "version" && args[1] === "--json") {
      const json = /^# version-json: (.*)$/m.exec(content)?.[1];
      return json === undefined ? exited(1, "", "error: unknown command 'version'") : exited(0, `${json}\n`);
    }
    return exited(1);
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const temps = async (): Promise<string[]> => (await readdir(dir)).filter((n) => n.includes(".download-"));

describe("ComponentService over a fake executor", () => {
  let exec: FakeExecutor;
  let runnerPath: string;
  let shimPath: string;
  let shutdown: AbortController;

  const make = (options?: { downloadTimeoutMs?: number; runningBuildId?: string }): ComponentService =>
    new ComponentService(
      { runner: runnerPath, shim: shimPath },
      exec.runner,
      pino({ level: "silent" }),
      shutdown.signal,
      options,
    );
  const put = async (path: string, content: string, mode = 0o755): Promise<void> => {
    await writeFile(path, content);
    await chmod(path, mode);
  };
  const entry = async (svc: ComponentService, name: ComponentInfo["name"]): Promise<ComponentInfo> => {
    const found = (await svc.list()).find((c) => c.name === name);
    if (!found) throw new Error(`no entry ${name}`);
    return found;
  };

  beforeEach(async () => {
    exec = new FakeExecutor();
    shutdown = new AbortController();
    await mkdir(join(dir, "src"));
    runnerPath = join(dir, "dstack-runner");
    shimPath = join(dir, "dstack-shim");
    exec.watched = runnerPath;
  });

  describe("U15 a version check at start and an install never overwrite each other", () => {
    it("U15 a start's slow --version that ends after an upgrade installed does not put the old version back", async () => {
      await put(runnerPath, script("1.0.0"));
      const release = exec.hold(runnerPath);
      const svc = make();
      const refreshing = svc.refresh();
      await waitFor(() => exec.runs.length === 1, { what: "the start's --version" });
      await put(join(dir, "src", "runner"), script("2.0.0"), 0o644);
      svc.install("dstack-runner", `file://${join(dir, "src", "runner")}`, undefined);
      await svc.settle();
      release();
      await refreshing;
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "2.0.0",
        status: "installed",
      });
      expect(await readFile(runnerPath, "utf8")).toBe(script("2.0.0"));
    });

    it("U15 a start's slow --version that ends while an upgrade downloads leaves it installing, and the upgrade ends installed", async () => {
      await put(runnerPath, script("1.0.0"));
      const release = exec.hold(runnerPath);
      let open!: () => void;
      gate = new Promise((resolve) => (open = resolve));
      const svc = make();
      const refreshing = svc.refresh();
      await waitFor(() => exec.runs.length === 1, { what: "the start's --version" });
      svc.install("dstack-runner", `${baseUrl}/runner-2.0.0`, undefined);
      release();
      await refreshing;
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "",
        status: "installing",
      });
      open();
      await svc.settle();
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "2.0.0",
        status: "installed",
      });
    });
  });

  describe("U14 an install never replaces a binary with something unverified", () => {
    it("verifies the download as a 0700 temp file beside the target while the target still holds the old binary, then renames it 0755", async () => {
      await put(runnerPath, script("1.0.0"));
      await put(join(dir, "src", "runner"), script("2.0.0"), 0o644);
      const svc = make();
      svc.install("dstack-runner", `file://${join(dir, "src", "runner")}`, undefined);
      await svc.settle();
      const first = exec.runs[0];
      expect(first?.argv[0]).toMatch(new RegExp(`^${dir}/\\.dstack-runner\\.download-`));
      expect(first?.argv.slice(1)).toEqual(["--version"]);
      expect(first?.mode).toBe(0o700);
      expect(first?.watchedContent).toBe(script("1.0.0"));
      expect(await readFile(runnerPath, "utf8")).toBe(script("2.0.0"));
      expect((await stat(runnerPath)).mode & 0o777).toBe(0o755);
      expect(await temps()).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "2.0.0",
        status: "installed",
      });
    });

    it("U14 an HTML page served with 200 and no sha256 is not run, leaves the old binary byte-identical, and the status installed with the old version", async () => {
      await put(runnerPath, script("1.0.0"));
      const svc = make();
      await svc.refresh();
      svc.install("dstack-runner", `${baseUrl}/page.html`, undefined);
      await svc.settle();
      expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
      expect((await stat(runnerPath)).mode & 0o777).toBe(0o755);
      expect(await temps()).toEqual([]);
      expect(exec.runs.filter((r) => r.content.startsWith("<!doctype"))).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "1.0.0",
        status: "installed",
        error: "the download is not a dstack-runner binary: neither an ELF executable nor a #! script",
      });
    });

    it("a failed install where no binary was reports not-installed (not error) and writes nothing at the target", async () => {
      const svc = make();
      await svc.refresh();
      svc.install("dstack-runner", `${baseUrl}/missing`, undefined);
      await svc.settle();
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "",
        status: "not-installed",
        error: "download failed: HTTP 404",
      });
      expect(await readdir(dir)).toEqual(["src"]);
    });

    it("U14 a file: FIFO whose writer closes without data is refused: no 0-byte binary, the old one stays", async () => {
      await put(runnerPath, script("1.0.0"));
      const fifo = join(dir, "src", "fifo");
      execFileSync("mkfifo", [fifo]);
      const svc = make();
      await svc.refresh();
      svc.install("dstack-runner", `file://${fifo}`, undefined);
      // A writer that opens the FIFO and closes it without writing, as in the issue.
      const deadline = Date.now() + 5_000;
      while ((await entry(svc, "dstack-runner")).status === "installing" && Date.now() < deadline) {
        try {
          closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
        } catch {
          // ENXIO: nobody has it open for reading (yet).
        }
        await sleep(5);
      }
      await svc.settle();
      expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
      expect(await temps()).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "1.0.0",
        status: "installed",
        error: expect.stringMatching(/is not a regular file/) as unknown,
      });
    });

    it("file: sources that are a device (/dev/null) or a directory are refused and leave the old binary", async () => {
      await put(runnerPath, script("1.0.0"));
      const svc = make();
      await svc.refresh();
      for (const url of ["file:///dev/null", `file://${join(dir, "src")}/`]) {
        svc.install("dstack-runner", url, undefined);
        await svc.settle();
        expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
        expect(await temps()).toEqual([]);
        expect(await entry(svc, "dstack-runner")).toEqual({
          name: "dstack-runner",
          version: "1.0.0",
          status: "installed",
          error: expect.stringMatching(/is not a regular file/) as unknown,
        });
      }
    });

    it("U14 a regular file that is not a binary (a shadow file) is neither run nor installed", async () => {
      await put(runnerPath, script("1.0.0"));
      const secret = join(dir, "src", "shadow");
      await put(secret, "root:$6$salt$hash:19000:0:99999:7:::\n", 0o600);
      const svc = make();
      await svc.refresh();
      svc.install("dstack-runner", `file://${secret}`, undefined);
      await svc.settle();
      expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
      expect((await stat(runnerPath)).mode & 0o777).toBe(0o755);
      expect(await temps()).toEqual([]);
      // Never run: spawn would have handed it to /bin/sh (ENOEXEC), which runs each line.
      expect(exec.runs.filter((r) => r.content.startsWith("root:"))).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "1.0.0",
        status: "installed",
        error: "the download is not a dstack-runner binary: neither an ELF executable nor a #! script",
      });
    });

    it("a binary that prints another component's version line is refused (a runner installed as dstack-shim)", async () => {
      await put(join(dir, "src", "runner"), script("0.19.40"), 0o644);
      const svc = make();
      await svc.refresh();
      svc.install("dstack-shim", `file://${join(dir, "src", "runner")}`, undefined);
      await svc.settle();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "",
        status: "not-installed",
        error: expect.stringMatching(/not a dstack-shim binary/) as unknown,
      });
      expect(await readdir(dir)).toEqual(["src"]);
    });

    it("a download whose body stalls ends promptly when the shim shuts down, leaving the old binary and no temp", async () => {
      await put(runnerPath, script("1.0.0"));
      const svc = make();
      await svc.refresh();
      svc.install("dstack-runner", `${baseUrl}/stall`, undefined);
      await waitFor(() => downloads === 1, { what: "the download" });
      await sleep(100);
      shutdown.abort(new Error("shim shutting down"));
      const ended = await Promise.race([svc.settle().then(() => true), sleep(2_000).then(() => false)]);
      expect(ended).toBe(true);
      expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
      expect(await temps()).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "1.0.0",
        status: "installed",
        error: "shim shutting down",
      });
    });

    it("a shutdown mid-download runs nothing more: a target changed meanwhile is reported as seen before, a removed one as not installed", async () => {
      for (const change of ["rewrite", "remove"] as const) {
        await put(runnerPath, script("1.0.0"));
        const svc = make();
        await svc.refresh();
        const before = downloads;
        svc.install("dstack-runner", `${baseUrl}/stall`, undefined);
        await waitFor(() => downloads === before + 1, { what: "the download" });
        if (change === "rewrite") await put(runnerPath, script("3.0.0"));
        else await rm(runnerPath);
        const ran = exec.runs.length;
        shutdown.abort(new Error("shim shutting down"));
        await svc.settle();
        expect(exec.runs.length).toBe(ran);
        expect(await entry(svc, "dstack-runner"), change).toEqual(
          change === "rewrite"
            ? { name: "dstack-runner", version: "1.0.0", status: "installed", error: "shim shutting down" }
            : { name: "dstack-runner", version: "", status: "not-installed", error: "shim shutting down" },
        );
        shutdown = new AbortController();
      }
    });

    it("a download whose body stalls fails at the download deadline", async () => {
      await put(runnerPath, script("1.0.0"));
      const svc = make({ downloadTimeoutMs: 300 });
      await svc.refresh();
      svc.install("dstack-runner", `${baseUrl}/stall`, undefined);
      const ended = await Promise.race([svc.settle().then(() => true), sleep(3_000).then(() => false)]);
      expect(ended).toBe(true);
      expect(await readFile(runnerPath, "utf8")).toBe(script("1.0.0"));
      expect(await temps()).toEqual([]);
      expect(await entry(svc, "dstack-runner")).toMatchObject({
        status: "installed",
        version: "1.0.0",
        error: "download did not finish within 300 ms",
      });
    });
  });

  describe("U18 a download that reports the running build is never installed", () => {
    const RUNNING = "0123456789abcdef0123";

    it("the binary in place of that build stays byte for byte: the component reports it, current", async () => {
      const inPlace = binary("taskshim version 1.3.3", { version: "1.3.3", build_id: RUNNING });
      await put(shimPath, inPlace);
      // A script that answers --version and the running build id, and would never serve.
      await put(
        join(dir, "src", "shim"),
        `${binary("taskshim version 1.3.3", { version: "1.3.3", build_id: RUNNING })}# not the build\n`,
        0o644,
      );
      const svc = make({ runningBuildId: RUNNING });
      await svc.refresh();
      const { ino } = await stat(shimPath);
      svc.install("dstack-shim", `file://${join(dir, "src", "shim")}`, undefined);
      await svc.settle();
      expect(await readFile(shimPath, "utf8")).toBe(inPlace);
      expect((await stat(shimPath)).ino).toBe(ino);
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "1.3.3",
        status: "installed",
        build_id: RUNNING,
      });
      expect(await temps()).toEqual([]);
    });

    it("over a binary of another build (installed, not running yet), nothing is replaced and the install fails", async () => {
      const pending = binary("taskshim version 1.4.0", {
        version: "1.4.0",
        build_id: "pending0000000000000",
      });
      await put(shimPath, pending);
      await put(
        join(dir, "src", "shim"),
        binary("taskshim version 1.3.3", { version: "1.3.3", build_id: RUNNING }),
        0o644,
      );
      const svc = make({ runningBuildId: RUNNING });
      await svc.refresh();
      svc.install("dstack-shim", `file://${join(dir, "src", "shim")}`, undefined);
      await svc.settle();
      expect(await readFile(shimPath, "utf8")).toBe(pending);
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "1.4.0",
        status: "installed",
        build_id: "pending0000000000000",
        error: `the download is the build this shim runs (1.3.3, build ${RUNNING}), but the binary in place is 1.4.0 (build pending0000000000000): not replaced`,
      });
    });
  });

  describe("build_id of dstack-shim", () => {
    it("the dstack-shim entry carries the build_id that a taskshim binary's `version --json` prints", async () => {
      await put(
        shimPath,
        binary("taskshim version 1.2.0", { version: "1.2.0", node: "26.12.1", build_id: "abc123" }),
      );
      const svc = make();
      await svc.refresh();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "1.2.0",
        status: "installed",
        build_id: "abc123",
      });
    });

    it("an install of dstack-shim reports the build_id of the binary it installed", async () => {
      await put(
        join(dir, "src", "shim"),
        binary("taskshim version 1.3.0", { version: "1.3.0", build_id: "b-2" }),
        0o644,
      );
      const svc = make();
      svc.install("dstack-shim", `file://${join(dir, "src", "shim")}`, undefined);
      await svc.settle();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "1.3.0",
        status: "installed",
        build_id: "b-2",
      });
    });

    it("no build_id without one: an older taskshim's JSON, a failing `version --json`; never asked of dstack-runner or a Go dstack-shim", async () => {
      const svc = make();
      await put(runnerPath, binary("dstack-runner version 0.19.40", { build_id: "runner" }));
      await put(shimPath, binary("taskshim version 1.0.0", { version: "1.0.0", node: "26.12.1" }));
      await svc.refresh();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "1.0.0",
        status: "installed",
      });
      await put(shimPath, binary("taskshim version 0.9.0"));
      await svc.refresh();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "0.9.0",
        status: "installed",
      });
      expect(await entry(svc, "dstack-runner")).toEqual({
        name: "dstack-runner",
        version: "0.19.40",
        status: "installed",
      });
      const asked = exec.jsonRuns().length;
      // A Go dstack-shim has no `version` command: given one it would start serving, so it is not asked.
      await put(shimPath, binary("dstack-shim version 0.19.1", { build_id: "go" }));
      await svc.refresh();
      expect(await entry(svc, "dstack-shim")).toEqual({
        name: "dstack-shim",
        version: "0.19.1",
        status: "installed",
      });
      expect(exec.jsonRuns().length).toBe(asked);
      expect(exec.jsonRuns().every((r) => r.argv[0] === shimPath)).toBe(true);
    });
  });
});
