/*
 * One download, http(s) or file: what is asked (the validators sent), what a 304 or a 200 gives,
 * which validators are kept for next time, and what is refused before a byte is read.
 */
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ComponentInstallError } from "./component-errors.js";
import { download, hasValidators, type DownloadRequest, type Validators } from "./download.js";

const sha = (bytes: string | Buffer): string => createHash("sha256").update(bytes).digest("hex");

let dir: string;
let temp: string;
let server: Server;
let base: string;
/** What the server answers: status, headers and body, or nothing (the body stalls). */
let answer: { status: number; headers?: Record<string, string>; body?: string; stall?: boolean };
let asked: IncomingHttpHeaders[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-download-"));
  temp = join(dir, ".target.download-1");
  answer = { status: 200, body: "#!/bin/sh\n" };
  asked = [];
  server = createServer((req, res) => {
    asked.push(req.headers);
    if (req.url === "/moved") {
      res.writeHead(302, { location: "/" }).end();
      return;
    }
    res.writeHead(answer.status, answer.headers ?? {});
    if (answer.stall) res.write("#!");
    else res.end(answer.body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  base = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
});

afterEach(async () => {
  server.closeAllConnections();
  server.close();
  await rm(dir, { recursive: true, force: true });
});

const request = (url: string, more: Partial<DownloadRequest> = {}): DownloadRequest => ({
  url: new URL(url),
  temp,
  shutdown: new AbortController().signal,
  timeoutMs: 5_000,
  ...more,
});
const exists = (path: string): Promise<boolean> =>
  stat(path).then(
    () => true,
    () => false,
  );
const failure = async (work: Promise<unknown>): Promise<Error> => {
  const error = await work.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(error instanceof Error)) throw new Error("the download did not fail");
  return error;
};

describe("hasValidators", () => {
  it("holds when any one of etag, lastModified, file is given", () => {
    expect(hasValidators(undefined)).toBe(false);
    expect(hasValidators({})).toBe(false);
    expect(hasValidators({ etag: '"x"' })).toBe(true);
    expect(hasValidators({ lastModified: "Thu, 01 Jan 2026 00:00:00 GMT" })).toBe(true);
    expect(hasValidators({ file: "1:2:3:4:5" })).toBe(true);
  });
});

describe("download over http", () => {
  it("a 200 writes the bytes to a new 0600 temp, with their sha256, size and the server's validators", async () => {
    answer = {
      status: 200,
      headers: { etag: '"v1"', "last-modified": "Thu, 01 Jan 2026 00:00:00 GMT" },
      body: "#!/bin/sh\necho hi\n",
    };
    expect(await download(request(`${base}/bin`))).toEqual({
      kind: "fetched",
      sha256: sha("#!/bin/sh\necho hi\n"),
      size: 18,
      validators: { etag: '"v1"', lastModified: "Thu, 01 Jan 2026 00:00:00 GMT" },
    });
    expect(await readFile(temp, "utf8")).toBe("#!/bin/sh\necho hi\n");
    expect((await stat(temp)).mode & 0o777).toBe(0o600);
    expect(asked[0]).not.toHaveProperty("if-none-match");
    expect(asked[0]).not.toHaveProperty("if-modified-since");
  });

  it("follows a redirect", async () => {
    answer = { status: 200, body: "abc" };
    expect(await download(request(`${base}/moved`))).toMatchObject({ kind: "fetched", sha256: sha("abc") });
    expect(asked).toHaveLength(2);
  });

  it("asks with each validator it holds (If-None-Match, If-Modified-Since), none for a file identity", async () => {
    const conditional = async (ifChanged: Validators): Promise<IncomingHttpHeaders> => {
      asked = [];
      await rm(temp, { force: true });
      await download(request(`${base}/bin`, { ifChanged }));
      return asked[0] ?? {};
    };
    const both = await conditional({ etag: '"v1"', lastModified: "Thu, 01 Jan 2026 00:00:00 GMT" });
    expect(both["if-none-match"]).toBe('"v1"');
    expect(both["if-modified-since"]).toBe("Thu, 01 Jan 2026 00:00:00 GMT");
    const etagOnly = await conditional({ etag: 'W/"v2"' });
    expect(etagOnly["if-none-match"]).toBe('W/"v2"');
    expect(etagOnly).not.toHaveProperty("if-modified-since");
    const dateOnly = await conditional({ lastModified: "Fri, 02 Jan 2026 00:00:00 GMT" });
    expect(dateOnly).not.toHaveProperty("if-none-match");
    expect(dateOnly["if-modified-since"]).toBe("Fri, 02 Jan 2026 00:00:00 GMT");
    const fileOnly = await conditional({ file: "1:2:3:4:5" });
    expect(fileOnly).not.toHaveProperty("if-none-match");
    expect(fileOnly).not.toHaveProperty("if-modified-since");
  });

  it("a 304 to a conditional request is not-modified and creates no temp", async () => {
    answer = { status: 304 };
    expect(await download(request(`${base}/bin`, { ifChanged: { etag: '"v1"' } }))).toEqual({
      kind: "not-modified",
    });
    expect(await download(request(`${base}/bin`, { ifChanged: { lastModified: "x" } }))).toEqual({
      kind: "not-modified",
    });
    expect(await exists(temp)).toBe(false);
  });

  it("a 304 to a request that asked nothing (no validators, or a file identity only) is a failure", async () => {
    answer = { status: 304 };
    for (const ifChanged of [undefined, {}, { file: "1:2:3:4:5" }]) {
      const error = await failure(download(request(`${base}/bin`, ifChanged ? { ifChanged } : {})));
      expect(error).toBeInstanceOf(ComponentInstallError);
      expect(error.message).toBe("download failed: HTTP 304");
    }
    expect(await exists(temp)).toBe(false);
  });

  it("any status but 200 and 304 is a failure that names it", async () => {
    for (const status of [201, 204, 206, 404, 500]) {
      answer = { status, body: status === 204 ? "" : "page" };
      const error = await failure(download(request(`${base}/bin`)));
      expect(error).toBeInstanceOf(ComponentInstallError);
      expect(error.message).toBe(`download failed: HTTP ${status}`);
    }
    expect(await exists(temp)).toBe(false);
  });

  it("keeps an ETag only as RFC 9110 spells it (quoted, W/ for weak, at most 512 characters)", async () => {
    const kept = async (etag: string): Promise<string | undefined> => {
      answer = { status: 200, headers: { etag }, body: "x" };
      await rm(temp, { force: true });
      const got = await download(request(`${base}/bin`));
      return got.kind === "fetched" ? got.validators.etag : "not fetched";
    };
    expect(await kept('"abc"')).toBe('"abc"');
    expect(await kept('""')).toBe('""');
    expect(await kept('W/"abc"')).toBe('W/"abc"');
    expect(await kept('"!#~"')).toBe('"!#~"');
    expect(await kept(`"${"e".repeat(510)}"`)).toBe(`"${"e".repeat(510)}"`);
    expect(await kept(`"${"e".repeat(511)}"`)).toBeUndefined();
    for (const etag of ["abc", 'w/"abc"', 'x"abc"', '"abc"x', '"a b"', '"a"b"', '"abc', 'abc"', "W/abc"]) {
      expect(await kept(etag), etag).toBeUndefined();
    }
  });

  it("keeps a Last-Modified only when it is a date, printable and at most 64 characters", async () => {
    const kept = async (lastModified: string): Promise<string | undefined> => {
      answer = { status: 200, headers: { "last-modified": lastModified }, body: "x" };
      await rm(temp, { force: true });
      const got = await download(request(`${base}/bin`));
      return got.kind === "fetched" ? got.validators.lastModified : "not fetched";
    };
    const date = "Thu, 01 Jan 2026 00:00:00 GMT";
    expect(await kept(date)).toBe(date);
    expect(await kept("1")).toBe("1");
    // V8 reads a parenthesized comment as nothing: a date as long as one likes.
    const at64 = `${date} (${"c".repeat(64 - date.length - 3)})`;
    expect(at64).toHaveLength(64);
    expect(await kept(at64)).toBe(at64);
    expect(await kept(`${date} (${"c".repeat(64 - date.length - 2)})`)).toBeUndefined();
    expect(await kept("not a date")).toBeUndefined();
    expect(await kept(`${date} é`)).toBeUndefined();
  });

  it("a server that cannot be reached fails with the cause, URLs redacted", async () => {
    // A port just freed: nothing listens there.
    const spare = createNetServer();
    await new Promise<void>((resolve) => spare.listen(0, "127.0.0.1", resolve));
    const address = spare.address();
    const port = typeof address === "object" && address ? address.port : 0;
    await new Promise((resolve) => spare.close(resolve));
    const refused = await failure(download(request(`http://127.0.0.1:${port}/bin`)));
    expect(refused).toBeInstanceOf(ComponentInstallError);
    expect(refused.message).toBe(`download failed: fetch failed: connect ECONNREFUSED 127.0.0.1:${port}`);
    expect(refused.cause).toBeInstanceOf(Error);
    const secret = await failure(download(request(`http://bob:pw@127.0.0.1:1/bin?sig=s3cret`)));
    expect(secret).toBeInstanceOf(ComponentInstallError);
    expect(secret.message).toMatch(/^download failed: /);
    expect(secret.message).not.toMatch(/pw|s3cret/);
  });

  it("a body that stalls fails at the deadline, and at once when the shim shuts down", async () => {
    answer = { status: 200, stall: true };
    const slow = await failure(download(request(`${base}/bin`, { timeoutMs: 200 })));
    expect(slow).toBeInstanceOf(ComponentInstallError);
    expect(slow.message).toBe("download did not finish within 200 ms");
    const shutdown = new AbortController();
    const reason = new Error("stop");
    const pending = failure(
      download(request(`${base}/bin`, { shutdown: shutdown.signal, temp: `${temp}-2` })),
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
    shutdown.abort(reason);
    const stopped = await pending;
    expect(stopped).toBeInstanceOf(ComponentInstallError);
    expect(stopped.message).toBe("shim shutting down");
    expect(stopped.cause).toBe(reason);
  });

  it("a shutdown already under way asks nothing and creates no temp", async () => {
    const shutdown = new AbortController();
    shutdown.abort(new Error("stop"));
    const error = await failure(download(request(`${base}/bin`, { shutdown: shutdown.signal })));
    expect(error.message).toBe("shim shutting down");
    expect(await exists(temp)).toBe(false);
  });
});

describe("download from a file", () => {
  it("reads a regular file (in chunks) and gives its identity as the validator", async () => {
    const source = join(dir, "source");
    const body = Buffer.alloc(200 * 1024, 7);
    await writeFile(source, body);
    const got = await download(request(`file://${source}`));
    const s = await stat(source, { bigint: true });
    expect(got).toEqual({
      kind: "fetched",
      sha256: sha(body),
      size: body.length,
      validators: { file: [s.dev, s.ino, s.size, s.mtimeNs, s.ctimeNs].join(":") },
    });
    expect((await readFile(temp)).equals(body)).toBe(true);
    expect((await stat(temp)).mode & 0o777).toBe(0o600);
  });

  it("is not-modified while the file's identity is the one given, and fetched once it changed", async () => {
    const source = join(dir, "source");
    await writeFile(source, "one");
    const first = await download(request(`file://${source}`, { temp: `${temp}-1` }));
    if (first.kind !== "fetched") throw new Error("not fetched");
    expect(await download(request(`file://${source}`, { ifChanged: first.validators }))).toEqual({
      kind: "not-modified",
    });
    expect(await exists(temp)).toBe(false);
    await writeFile(source, "two");
    expect(await download(request(`file://${source}`, { ifChanged: first.validators }))).toMatchObject({
      kind: "fetched",
      sha256: sha("two"),
    });
  });

  it("refuses what is not a regular file, naming what it is, before reading a byte", async () => {
    await mkdir(join(dir, "a-dir"));
    execFileSync("mkfifo", [join(dir, "fifo")]);
    const socketPath = join(dir, "sock");
    const socket = createNetServer();
    await new Promise<void>((resolve) => socket.listen(socketPath, resolve));
    try {
      for (const [path, kind] of [
        [join(dir, "a-dir"), "a directory"],
        [join(dir, "fifo"), "a FIFO"],
        ["/dev/null", "a character device"],
        [socketPath, "a socket"],
      ] as const) {
        const error = await failure(download(request(`file://${path}`)));
        expect(error).toBeInstanceOf(ComponentInstallError);
        expect(error.message).toBe(`${path} is not a regular file (${kind})`);
      }
    } finally {
      socket.close();
    }
    expect(await exists(temp)).toBe(false);
  });

  it("a missing file, or a file URL with a host, fails saying why", async () => {
    const missing = join(dir, "missing");
    const error = await failure(download(request(`file://${missing}`)));
    expect(error).toBeInstanceOf(ComponentInstallError);
    expect(error.message).toMatch(new RegExp(`^cannot read ${missing}: ENOENT`));
    const remote = await failure(download(request("file://elsewhere/bin")));
    expect(remote).toBeInstanceOf(ComponentInstallError);
    expect(remote.message).toMatch(/^invalid file url: /);
  });
});
