/*
 * The memory of where each component was fetched from: when a remembered verdict still decides
 * an install, how it is written and read back, and every way the file is refused.
 */
import { execFileSync } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  COMPONENT_SOURCES_FILE,
  ComponentSources,
  MAX_SOURCES_FILE_BYTES,
  sourceRecord,
  urlKey,
  verdictHolds,
  verdictKey,
  type AskedInstall,
  type SourceRecord,
} from "./component-sources.js";
import type { FileIdentity } from "./file-identity.js";

const URL_A = "https://user:pw@example.com/shim?X-Amz-Signature=s3cret#frag";
const HEX_A = "a".repeat(64);
const HEX_B = "b".repeat(64);
const TARGET: FileIdentity = { dev: "1", ino: "2", size: "3", mtimeNs: "4", ctimeNs: "5" };

const installed = (more: Partial<SourceRecord> = {}): SourceRecord => ({
  ...sourceRecord(
    URL_A,
    undefined,
    { sha256: HEX_A, validators: { etag: '"e"' } },
    {
      kind: "installed",
      target: TARGET,
      version: "1.0.0",
    },
  ),
  ...more,
});
const refused = (rule: "sha256" | "content" | "identity", requestedSha256?: string): SourceRecord =>
  sourceRecord(
    URL_A,
    requestedSha256,
    { sha256: HEX_A, validators: {} },
    {
      kind: "refused",
      rule,
      reason: `refused by ${rule}`,
    },
  );
const ask = (more: Partial<AskedInstall> = {}): AskedInstall => ({
  url: URL_A,
  sha256: undefined,
  target: TARGET,
  allowShimHandover: false,
  ...more,
});

describe("sourceRecord", () => {
  it("keys the full URL by its sha256, keeps it redacted, and the requested digest only when given", () => {
    const before = Date.now();
    const record = sourceRecord(
      URL_A,
      HEX_B,
      { sha256: HEX_A, validators: { file: "f" } },
      {
        kind: "refused",
        rule: "sha256",
        reason: "r",
      },
    );
    expect(record).toEqual({
      urlSha256: urlKey(URL_A),
      url: "https://example.com/shim",
      requestedSha256: HEX_B,
      validators: { file: "f" },
      sha256: HEX_A,
      verdict: { kind: "refused", rule: "sha256", reason: "r" },
      recordedAt: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) as unknown,
    });
    expect(Date.parse(record.recordedAt)).toBeGreaterThanOrEqual(before - 1);
    expect(urlKey(URL_A)).toMatch(/^[0-9a-f]{64}$/);
    expect(urlKey(URL_A)).not.toBe(urlKey("https://example.com/shim"));
    expect(installed()).not.toHaveProperty("requestedSha256");
  });
});

describe("verdictHolds", () => {
  it("never for another URL (secrets included in the match)", () => {
    expect(verdictHolds(installed(), ask())).toBe(true);
    expect(verdictHolds(installed(), ask({ url: "https://example.com/shim" }))).toBe(false);
    expect(verdictHolds(refused("content"), ask({ url: `${URL_A}x` }))).toBe(false);
  });

  it("installed: while the target is the file installed, and the digest asked (if any) is the bytes'", () => {
    expect(verdictHolds(installed(), ask({ sha256: HEX_A }))).toBe(true);
    expect(verdictHolds(installed(), ask({ sha256: HEX_B }))).toBe(false);
    expect(verdictHolds(installed(), ask({ target: { ...TARGET, ino: "9" } }))).toBe(false);
    expect(verdictHolds(installed(), ask({ target: undefined }))).toBe(false);
    expect(verdictHolds(installed(), ask({ allowShimHandover: true }))).toBe(true);
  });

  it("a sha256 refusal: while the same digest is asked for", () => {
    expect(verdictHolds(refused("sha256", HEX_B), ask({ sha256: HEX_B }))).toBe(true);
    expect(verdictHolds(refused("sha256", HEX_B), ask({ sha256: HEX_A }))).toBe(false);
    expect(verdictHolds(refused("sha256", HEX_B), ask())).toBe(false);
    expect(verdictHolds(refused("sha256"), ask())).toBe(false);
  });

  it("a content refusal: while no other digest is asked for, whatever the target", () => {
    expect(verdictHolds(refused("content"), ask())).toBe(true);
    expect(verdictHolds(refused("content"), ask({ target: undefined, allowShimHandover: true }))).toBe(true);
    expect(verdictHolds(refused("content"), ask({ sha256: HEX_A }))).toBe(true);
    expect(verdictHolds(refused("content"), ask({ sha256: HEX_B }))).toBe(false);
  });

  it("an identity refusal: while handover is off and no other digest is asked for", () => {
    expect(verdictHolds(refused("identity"), ask())).toBe(true);
    expect(verdictHolds(refused("identity"), ask({ sha256: HEX_A }))).toBe(true);
    expect(verdictHolds(refused("identity"), ask({ allowShimHandover: true }))).toBe(false);
    expect(verdictHolds(refused("identity"), ask({ sha256: HEX_B }))).toBe(false);
  });
});

describe("verdictKey", () => {
  it("is the URL's key, the bytes' digest and the reason (or installed)", () => {
    expect(verdictKey(refused("content"))).toBe(`${urlKey(URL_A)}:${HEX_A}:refused by content`);
    expect(verdictKey(installed())).toBe(`${urlKey(URL_A)}:${HEX_A}:installed`);
  });
});

describe("ComponentSources", () => {
  let dir: string;
  let file: string;
  let logs: { level: number; msg: string; [key: string]: unknown }[];
  const log = () =>
    pino(
      { level: "debug" },
      { write: (line: string) => void logs.push(JSON.parse(line) as (typeof logs)[number]) },
    );
  const warnings = () => logs.filter((l) => l.level === 40).map((l) => [l.msg, l.error]);
  const IGNORED = "component sources file ignored; the next install of each component downloads in full";

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "taskshim-sources-"));
    file = join(dir, COMPONENT_SOURCES_FILE);
    logs = [];
  });

  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("without a path: in memory only, nothing written", async () => {
    const sources = new ComponentSources(undefined, log());
    expect(await sources.get("dstack-shim")).toBeUndefined();
    await sources.put("dstack-shim", installed());
    expect(await sources.get("dstack-shim")).toEqual(installed({ recordedAt: expect.any(String) as never }));
    expect(await sources.get("dstack-runner")).toBeUndefined();
    await expect(stat(file)).rejects.toThrow(/ENOENT/);
  });

  it("writes every field (snake_case, 0600) and a new process reads the same records back", async () => {
    const shim = installed({
      requestedSha256: HEX_A,
      validators: { etag: '"e"', lastModified: "Thu, 01 Jan 2026 00:00:00 GMT", file: "1:2" },
      verdict: { kind: "installed", target: TARGET, version: "1.0.0", buildId: "b-1" },
    });
    const runner = refused("sha256", HEX_B);
    const first = new ComponentSources(file, log());
    await first.put("dstack-shim", shim);
    await first.put("dstack-runner", runner);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const text = await readFile(file, "utf8");
    expect(text.endsWith("}\n")).toBe(true);
    expect(JSON.parse(text)).toEqual({
      format: 1,
      components: {
        "dstack-shim": {
          url_sha256: urlKey(URL_A),
          url: "https://example.com/shim",
          requested_sha256: HEX_A,
          validators: { etag: '"e"', last_modified: "Thu, 01 Jan 2026 00:00:00 GMT", file: "1:2" },
          sha256: HEX_A,
          verdict: {
            kind: "installed",
            target: { dev: "1", ino: "2", size: "3", mtime_ns: "4", ctime_ns: "5" },
            version: "1.0.0",
            build_id: "b-1",
          },
          recorded_at: shim.recordedAt,
        },
        "dstack-runner": {
          url_sha256: urlKey(URL_A),
          url: "https://example.com/shim",
          requested_sha256: HEX_B,
          validators: {},
          sha256: HEX_A,
          verdict: { kind: "refused", rule: "sha256", reason: "refused by sha256" },
          recorded_at: runner.recordedAt,
        },
      },
    });
    expect(text).not.toContain("s3cret");
    const second = new ComponentSources(file, log());
    expect(await second.get("dstack-shim")).toEqual(shim);
    expect(await second.get("dstack-runner")).toEqual(runner);
    const bare = new ComponentSources(file, log());
    await bare.put("dstack-shim", installed({ validators: {} }));
    expect(await new ComponentSources(file, log()).get("dstack-shim")).toEqual(
      installed({ validators: {}, recordedAt: expect.any(String) as never }),
    );
    expect(logs).toEqual([]);
  });

  it("an unchanged record (only its time differs) is not written again; a changed one is", async () => {
    const sources = new ComponentSources(file, log());
    await sources.put("dstack-shim", installed({ recordedAt: "2026-01-01T00:00:00.000Z" }));
    const written = await stat(file, { bigint: true });
    await sources.put("dstack-shim", installed({ recordedAt: "2026-01-02T00:00:00.000Z" }));
    const again = await stat(file, { bigint: true });
    expect([again.ino, again.mtimeNs]).toEqual([written.ino, written.mtimeNs]);
    await sources.put("dstack-shim", installed({ sha256: HEX_B }));
    expect((await stat(file, { bigint: true })).ino).not.toBe(written.ino);
    expect(await new ComponentSources(file, log()).get("dstack-shim")).toMatchObject({ sha256: HEX_B });
  });

  it("a long URL and reason are cut to what the schema takes, so the file stays readable", async () => {
    const long = sourceRecord(
      `https://example.com/${"p".repeat(5000)}`,
      undefined,
      { sha256: HEX_A, validators: {} },
      { kind: "refused", rule: "content", reason: "r".repeat(3000) },
    );
    await new ComponentSources(file, log()).put("dstack-runner", long);
    const read = await new ComponentSources(file, log()).get("dstack-runner");
    expect(read?.url).toHaveLength(4096);
    expect(read?.verdict).toEqual({ kind: "refused", rule: "content", reason: "r".repeat(2048) });
    expect(logs).toEqual([]);
  });

  it("removes the temp files a crash left (and nothing else) when the file is first read", async () => {
    await writeFile(join(dir, `.${COMPONENT_SOURCES_FILE}.tmp-1-1`), "{");
    await writeFile(join(dir, `.${COMPONENT_SOURCES_FILE}.tmp-2-7`), "{");
    await writeFile(join(dir, `${COMPONENT_SOURCES_FILE}.tmp-1-1`), "kept");
    await writeFile(join(dir, "other"), "kept");
    expect(await new ComponentSources(file, log()).get("dstack-shim")).toBeUndefined();
    expect((await readdir(dir)).sort()).toEqual([`${COMPONENT_SOURCES_FILE}.tmp-1-1`, "other"]);
    expect(logs).toEqual([]);
  });

  it("a file of exactly the cap is read; one byte more is refused", async () => {
    const shim = installed();
    await new ComponentSources(file, log()).put("dstack-shim", shim);
    const text = (await readFile(file, "utf8")).trimEnd();
    await writeFile(file, text + " ".repeat(MAX_SOURCES_FILE_BYTES - text.length));
    expect(await new ComponentSources(file, log()).get("dstack-shim")).toEqual(shim);
    await writeFile(file, text + " ".repeat(MAX_SOURCES_FILE_BYTES - text.length + 1));
    expect(await new ComponentSources(file, log()).get("dstack-shim")).toBeUndefined();
    expect(warnings()).toEqual([[IGNORED, `it is larger than ${MAX_SOURCES_FILE_BYTES} bytes`]]);
  });

  it("each way the file is refused says why, once, and the shim goes on without it", async () => {
    const cases: [string, () => Promise<void>, string][] = [
      ["not JSON", () => writeFile(file, "{ not json"), "it is not JSON"],
      [
        "another format",
        () => writeFile(file, JSON.stringify({ format: 2, components: {} })),
        "it does not match the schema: /format must be equal to constant",
      ],
      [
        "a record of another shape",
        () => writeFile(file, JSON.stringify({ format: 1, components: { "dstack-shim": 7 } })),
        "it does not match the schema: /components/dstack-shim must be object",
      ],
      ["a JSON array", () => writeFile(file, "[]"), "it does not match the schema: / must be object"],
      [
        "a symlink",
        async () => {
          await writeFile(join(dir, "real.json"), JSON.stringify({ format: 1, components: {} }));
          await symlink(join(dir, "real.json"), file);
        },
        "it is a symlink",
      ],
      [
        "a FIFO",
        () => {
          execFileSync("mkfifo", [file]);
          return Promise.resolve();
        },
        "it is not a regular file",
      ],
      [
        "a path below a regular file",
        async () => {
          await writeFile(join(dir, "plain"), "");
          file = join(dir, "plain", COMPONENT_SOURCES_FILE);
        },
        "cannot open it: ENOTDIR",
      ],
    ];
    for (const [what, spoil, why] of cases) {
      await rm(file, { force: true });
      file = join(dir, COMPONENT_SOURCES_FILE);
      await rm(file, { force: true });
      logs = [];
      await spoil();
      const sources = new ComponentSources(file, log());
      expect(await sources.get("dstack-shim"), what).toBeUndefined();
      expect(await sources.get("dstack-runner"), what).toBeUndefined();
      // An errno's message goes on after its code (`ENOTDIR: not a directory, open …`).
      expect(warnings(), what).toEqual([
        [IGNORED, why.endsWith("ENOTDIR") ? expect.stringMatching(new RegExp(`^${why}`)) : why],
      ]);
    }
  });

  it("a write that fails is logged once per write; the record is still kept in memory", async () => {
    const sources = new ComponentSources(join(dir, "missing-dir", COMPONENT_SOURCES_FILE), log());
    await sources.put("dstack-shim", installed());
    expect(await sources.get("dstack-shim")).toEqual(installed({ recordedAt: expect.any(String) as never }));
    expect(logs.map((l) => [l.level, l.msg])).toEqual([
      [
        40,
        "cannot write the component sources file; after a restart, the next install of each component downloads in full",
      ],
    ]);
  });
});
