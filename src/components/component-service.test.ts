import { createHash } from "node:crypto";
import { chmod, mkdtemp, readdir, readFile, stat, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { ComponentRequestError, ComponentService } from "./component-service.js";

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

afterEach(() => {
  server.close();
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

  it("leaves the old binary untouched on a sha256 mismatch and ends in error", async () => {
    const target = join(dir, "dstack-runner");
    await writeFile(target, script("0.19.1"));
    await chmod(target, 0o755);
    await service.refresh();
    service.install("dstack-runner", `${baseUrl}/runner-0.19.2`, "0".repeat(64));
    await waitStatus("dstack-runner", "error");
    expect(await readFile(target, "utf8")).toBe(script("0.19.1"));
    expect((await readdir(dir)).filter((n) => n.includes("download"))).toEqual([]);
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

  it("does not download the same install again (upstream #3953)", async () => {
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, undefined);
    await waitStatus("dstack-runner", "installed");
    service.install("dstack-runner", `${baseUrl}/runner-0.19.40`, undefined);
    await waitStatus("dstack-runner", "installed");
    expect(downloads).toBe(1);
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
});
