import { createHash } from "node:crypto";
import { constants } from "node:fs";
import { open, readdir, unlink } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { Logger } from "pino";
import Type, { type Static } from "typebox";
import Value from "typebox/value";
import { errorMessage } from "../errors/error-message.js";
import { tempFilePrefix, writeFileDurably } from "../state/durable-write.js";
import type { RefusalRule } from "./component-errors.js";
import type { ComponentName } from "./component-service.js";
import type { Validators } from "./download.js";
import { sameFile, type FileIdentity } from "./file-identity.js";
import { redactUrl } from "./redact-url.js";

/** The file in the shim's home that remembers where each component was last fetched from. */
export const COMPONENT_SOURCES_FILE = "component-sources.json";
/** Two records take a few KiB; a bigger file is not one this shim wrote. */
export const MAX_SOURCES_FILE_BYTES = 64 * 1024;

/** What an install decided about the bytes it fetched from a URL. */
export type SourceVerdict =
  | {
      readonly kind: "installed";
      /** The target as the install left it: the verdict holds while the target is this file. */
      readonly target: FileIdentity;
      readonly version: string;
      readonly buildId?: string;
    }
  | { readonly kind: "refused"; readonly rule: RefusalRule; readonly reason: string };

/** One component's memory: the URL last fetched, what it served, and the verdict on it. */
export interface SourceRecord {
  /** The sha256 of the full URL: matches it without keeping its secrets on disk. */
  readonly urlSha256: string;
  /** The URL redacted ({@link redactUrl}), for a person reading the file. */
  readonly url: string;
  /** The `sha256` the request named, if any. */
  readonly requestedSha256?: string;
  readonly validators: Validators;
  /** The sha256 of the bytes fetched. */
  readonly sha256: string;
  readonly verdict: SourceVerdict;
  /** When it was recorded (ISO 8601), for a person. */
  readonly recordedAt: string;
}

/** The key a URL is remembered under. */
export function urlKey(url: string): string {
  return createHash("sha256").update(url).digest("hex");
}

/** A source file that cannot be used: the shim goes on without it. */
export class ComponentSourcesFileError extends Error {
  override readonly name = "ComponentSourcesFileError";
}

const Hex64 = Type.String({ pattern: "^[0-9a-f]{64}$" });
const Decimal = Type.String({ pattern: "^[0-9]{1,40}$" });
const StoredIdentity = Type.Object({
  dev: Decimal,
  ino: Decimal,
  size: Decimal,
  mtime_ns: Decimal,
  ctime_ns: Decimal,
});
const StoredVerdict = Type.Union([
  Type.Object({
    kind: Type.Literal("installed"),
    target: StoredIdentity,
    version: Type.String({ maxLength: 256 }),
    build_id: Type.Optional(Type.String({ maxLength: 256 })),
  }),
  Type.Object({
    kind: Type.Literal("refused"),
    rule: Type.Union([Type.Literal("sha256"), Type.Literal("content"), Type.Literal("identity")]),
    reason: Type.String({ maxLength: 2048 }),
  }),
]);
const StoredRecord = Type.Object({
  url_sha256: Hex64,
  url: Type.String({ maxLength: 4096 }),
  requested_sha256: Type.Optional(Hex64),
  validators: Type.Object({
    etag: Type.Optional(Type.String({ maxLength: 512 })),
    last_modified: Type.Optional(Type.String({ maxLength: 64 })),
    file: Type.Optional(Type.String({ maxLength: 256 })),
  }),
  sha256: Hex64,
  verdict: StoredVerdict,
  recorded_at: Type.String({ maxLength: 64 }),
});
/** The file: `format` 1, one record per component (fields it does not know are ignored). */
const StoredSources = Type.Object({
  format: Type.Literal(1),
  components: Type.Object({
    "dstack-runner": Type.Optional(StoredRecord),
    "dstack-shim": Type.Optional(StoredRecord),
  }),
});
type Stored = Static<typeof StoredSources>;
type StoredRecordType = Static<typeof StoredRecord>;

/**
 * Where each component was last fetched from, kept in `<home>/component-sources.json` so that a
 * restart does not cost a full download: it is a cache. A file that cannot be read, is not a
 * regular file (a symlink is not followed), is larger than {@link MAX_SOURCES_FILE_BYTES} or
 * does not match the schema is ignored with one warning (each component's next install then
 * downloads in full); a write that fails (a full or read-only home) is logged and the install it
 * records is not failed. Without a path, it lives in memory only.
 */
export class ComponentSources {
  private loaded: Promise<Map<ComponentName, SourceRecord>> | undefined;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    private readonly path: string | undefined,
    private readonly log: Logger,
  ) {}

  /** The record of a component, read from the file at the first call. */
  async get(name: ComponentName): Promise<SourceRecord | undefined> {
    return (await this.records()).get(name);
  }

  /**
   * Records a component's source, and writes the file durably when that changed it. Never
   * throws: a failed write is logged and the record stays in memory.
   */
  async put(name: ComponentName, record: SourceRecord): Promise<void> {
    const records = await this.records();
    const before = records.get(name);
    records.set(name, record);
    // A restart needs nothing but the validators and the verdict: an unchanged record (the
    // same answer at every check) is not written again.
    if (before && sameRecord(before, record)) return;
    const text = `${JSON.stringify(toStored(records), null, 2)}\n`;
    const path = this.path;
    if (path === undefined) return;
    this.writing = this.writing.then(async () => {
      try {
        await writeFileDurably(path, text, 0o600);
      } catch (error) {
        this.log.warn(
          { file: path, error: errorMessage(error) },
          "cannot write the component sources file; after a restart, the next install of each component downloads in full",
        );
      }
    });
    await this.writing;
  }

  private records(): Promise<Map<ComponentName, SourceRecord>> {
    this.loaded ??= this.load();
    return this.loaded;
  }

  private async load(): Promise<Map<ComponentName, SourceRecord>> {
    const records = new Map<ComponentName, SourceRecord>();
    if (this.path === undefined) return records;
    await removeStaleTemps(this.path);
    let stored: Stored | undefined;
    try {
      stored = await readSourcesFile(this.path);
    } catch (error) {
      this.log.warn(
        { file: this.path, error: errorMessage(error) },
        "component sources file ignored; the next install of each component downloads in full",
      );
      return records;
    }
    for (const name of ["dstack-runner", "dstack-shim"] as const) {
      const record = stored?.components[name];
      if (record) records.set(name, fromStored(record));
    }
    return records;
  }
}

/** Temp files of a write a crash cut short (one shim per home: none is being written now). */
async function removeStaleTemps(path: string): Promise<void> {
  const prefix = tempFilePrefix(path);
  const names = await readdir(dirname(path)).catch(() => []);
  await Promise.all(
    names
      .filter((name) => name.startsWith(prefix))
      .map((name) => unlink(join(dirname(path), name)).catch(() => undefined)),
  );
}

/**
 * Reads the file without trusting it: no symlink followed, no FIFO waited on, no more than the
 * cap read, the schema checked. Undefined when there is none.
 */
async function readSourcesFile(path: string): Promise<Stored | undefined> {
  let handle;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    if (code === "ELOOP") throw new ComponentSourcesFileError("it is a symlink", { cause: error });
    throw new ComponentSourcesFileError(`cannot open it: ${errorMessage(error)}`, { cause: error });
  }
  let text: string;
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) throw new ComponentSourcesFileError("it is not a regular file");
    if (stats.size > MAX_SOURCES_FILE_BYTES) {
      throw new ComponentSourcesFileError(`it is larger than ${MAX_SOURCES_FILE_BYTES} bytes`);
    }
    // One byte more than the cap: a file that grew since the fstat is caught too.
    const buffer = Buffer.alloc(MAX_SOURCES_FILE_BYTES + 1);
    let length = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, length, buffer.length - length, length);
      if (bytesRead === 0) break;
      length += bytesRead;
      if (length > MAX_SOURCES_FILE_BYTES) {
        throw new ComponentSourcesFileError(`it is larger than ${MAX_SOURCES_FILE_BYTES} bytes`);
      }
    }
    text = buffer.subarray(0, length).toString("utf8");
  } finally {
    await handle.close();
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (error) {
    throw new ComponentSourcesFileError("it is not JSON", { cause: error });
  }
  if (!Value.Check(StoredSources, raw)) {
    const first = Value.Errors(StoredSources, raw)[0];
    throw new ComponentSourcesFileError(
      `it does not match the schema: ${first ? `${first.instancePath || "/"} ${first.message}` : "unknown"}`,
    );
  }
  return raw;
}

function sameRecord(a: SourceRecord, b: SourceRecord): boolean {
  // recordedAt changes at every put; the rest is what a restart reads.
  return JSON.stringify({ ...a, recordedAt: "" }) === JSON.stringify({ ...b, recordedAt: "" });
}

function toStored(records: ReadonlyMap<ComponentName, SourceRecord>): Stored {
  const components: Stored["components"] = {};
  for (const [name, r] of records) {
    const v = r.verdict;
    components[name] = {
      url_sha256: r.urlSha256,
      url: r.url.slice(0, 4096),
      ...(r.requestedSha256 !== undefined ? { requested_sha256: r.requestedSha256 } : {}),
      validators: {
        ...(r.validators.etag !== undefined ? { etag: r.validators.etag } : {}),
        ...(r.validators.lastModified !== undefined ? { last_modified: r.validators.lastModified } : {}),
        ...(r.validators.file !== undefined ? { file: r.validators.file } : {}),
      },
      sha256: r.sha256,
      verdict:
        v.kind === "installed"
          ? {
              kind: "installed",
              target: {
                dev: v.target.dev,
                ino: v.target.ino,
                size: v.target.size,
                mtime_ns: v.target.mtimeNs,
                ctime_ns: v.target.ctimeNs,
              },
              version: v.version,
              ...(v.buildId !== undefined ? { build_id: v.buildId } : {}),
            }
          : { kind: "refused", rule: v.rule, reason: v.reason.slice(0, 2048) },
      recorded_at: r.recordedAt,
    };
  }
  return { format: 1, components };
}

function fromStored(s: StoredRecordType): SourceRecord {
  const v = s.verdict;
  return {
    urlSha256: s.url_sha256,
    url: s.url,
    ...(s.requested_sha256 !== undefined ? { requestedSha256: s.requested_sha256 } : {}),
    validators: {
      ...(s.validators.etag !== undefined ? { etag: s.validators.etag } : {}),
      ...(s.validators.last_modified !== undefined ? { lastModified: s.validators.last_modified } : {}),
      ...(s.validators.file !== undefined ? { file: s.validators.file } : {}),
    },
    sha256: s.sha256,
    verdict:
      v.kind === "installed"
        ? {
            kind: "installed",
            target: {
              dev: v.target.dev,
              ino: v.target.ino,
              size: v.target.size,
              mtimeNs: v.target.mtime_ns,
              ctimeNs: v.target.ctime_ns,
            },
            version: v.version,
            ...(v.build_id !== undefined ? { buildId: v.build_id } : {}),
          }
        : { kind: "refused", rule: v.rule, reason: v.reason },
    recordedAt: s.recorded_at,
  };
}

/** An install request, as a remembered verdict is matched against it. */
export interface AskedInstall {
  readonly url: string;
  /** The sha256 the request named, if any. */
  readonly sha256: string | undefined;
  /** The install's target as it is now (undefined: missing). */
  readonly target: FileIdentity | undefined;
  readonly allowShimHandover: boolean;
}

/**
 * Whether a remembered verdict still decides an install, so the source may be asked whether its
 * bytes changed: the same URL; the sha256 asked for, if any, is the bytes'; an "installed"
 * verdict while the target is still the file it installed (anything else there, and the next
 * download is a full one); a refusal while the rule that refused still applies (a sha256
 * refusal while the same digest is asked for, an identity refusal while handover is off).
 */
export function verdictHolds(record: SourceRecord, asked: AskedInstall): boolean {
  if (record.urlSha256 !== urlKey(asked.url)) return false;
  const asksTheseBytes = asked.sha256 === undefined || asked.sha256 === record.sha256;
  const verdict = record.verdict;
  if (verdict.kind === "installed") return asksTheseBytes && sameFile(verdict.target, asked.target);
  switch (verdict.rule) {
    case "sha256":
      return asked.sha256 !== undefined && asked.sha256 === record.requestedSha256;
    case "content":
      return asksTheseBytes;
    case "identity":
      return asksTheseBytes && !asked.allowShimHandover;
  }
}

/** A verdict as logged once: its URL, its bytes and what was decided. */
export function verdictKey(record: SourceRecord): string {
  const reason = record.verdict.kind === "refused" ? record.verdict.reason : "installed";
  return `${record.urlSha256}:${record.sha256}:${reason}`;
}

/** A new record for the bytes fetched from `url` and the verdict on them. */
export function sourceRecord(
  url: string,
  requestedSha256: string | undefined,
  fetched: { readonly sha256: string; readonly validators: Validators },
  verdict: SourceVerdict,
): SourceRecord {
  return {
    urlSha256: urlKey(url),
    url: redactUrl(url),
    ...(requestedSha256 !== undefined ? { requestedSha256 } : {}),
    validators: fetched.validators,
    sha256: fetched.sha256,
    verdict,
    recordedAt: new Date().toISOString(),
  };
}
