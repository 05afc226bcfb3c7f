import { constants } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import { writeFileDurably } from "./durable-write.js";

/** The file in the home that records the engine its containers live on. */
export const ENGINE_RECORD_FILE = ".taskshim-engine.json";
/** The record's format; a newer one is refused, never rewritten. */
const RECORD_VERSION = 1;
/** A record is a few hundred bytes; anything larger is not one. */
const MAX_RECORD_BYTES = 16 * 1024;

/** The engine a home is bound to: its fingerprint and the address it was reached at. */
export interface EngineRecord {
  readonly kind: "docker" | "podman";
  /** Docker's daemon ID; `""` for Podman. */
  readonly id: string;
  readonly rootDir: string;
  /** The engine URL (`unix:///var/run/docker.sock`) a start without `--engine-url` reaches it at. */
  readonly url: string;
  /** When it was recorded (ISO 8601, for people). */
  readonly boundAt: string;
}

/** The record exists but cannot be used; the message names the file and what to do. */
export class EngineRecordError extends Error {
  override readonly name = "EngineRecordError";
}

/**
 * Reads the home's engine record; undefined when there is none. The file is opened without
 * following a symlink and without blocking (a FIFO), checked to be a regular file of a sane size,
 * and read once.
 *
 * @throws EngineRecordError for anything else: a damaged record is never replaced silently, since a
 * new binding would let this home act on another engine's view of its containers.
 */
export async function loadEngineRecord(home: string): Promise<EngineRecord | undefined> {
  const path = join(home, ENGINE_RECORD_FILE);
  const damaged = (why: string, cause?: unknown): EngineRecordError =>
    new EngineRecordError(
      `the engine record ${path} is ${why}: restore it, or delete it to bind this home to the engine it starts on`,
      { cause },
    );
  let text: string;
  try {
    const handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      const stats = await handle.stat();
      if (!stats.isFile()) throw damaged("not a regular file");
      if (stats.size > MAX_RECORD_BYTES) throw damaged(`${stats.size} bytes long`);
      const buffer = Buffer.alloc(MAX_RECORD_BYTES + 1);
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
      text = buffer.subarray(0, bytesRead).toString("utf8");
    } finally {
      await handle.close();
    }
  } catch (error) {
    if (error instanceof EngineRecordError) throw error;
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    // O_NOFOLLOW on a symlink.
    if (code === "ELOOP") throw damaged("a symlink", error);
    throw new EngineRecordError(`cannot read the engine record ${path}: ${errorMessage(error)}`, {
      cause: error,
    });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw damaged("not JSON", error);
  }
  const r = (typeof parsed === "object" && parsed !== null ? parsed : {}) as Record<string, unknown>;
  if (typeof r.version === "number" && r.version > RECORD_VERSION) {
    throw new EngineRecordError(
      `the engine record ${path} has format ${r.version}, written by a newer taskshim: run that release, or a newer one`,
    );
  }
  const text1 = (value: unknown): value is string => typeof value === "string" && value.length <= 1024;
  if (
    r.version !== RECORD_VERSION ||
    (r.kind !== "docker" && r.kind !== "podman") ||
    !text1(r.id) ||
    !text1(r.root_dir) ||
    !r.root_dir.startsWith("/") ||
    !text1(r.url) ||
    !text1(r.bound_at)
  ) {
    throw damaged("damaged");
  }
  return { kind: r.kind, id: r.id, rootDir: r.root_dir, url: r.url, boundAt: r.bound_at };
}

/** Writes the home's engine record durably (temp file, fsync, rename, fsync the home). */
export async function writeEngineRecord(home: string, record: EngineRecord): Promise<void> {
  const body = {
    version: RECORD_VERSION,
    kind: record.kind,
    id: record.id,
    root_dir: record.rootDir,
    url: record.url,
    bound_at: record.boundAt,
  };
  await writeFileDurably(join(home, ENGINE_RECORD_FILE), `${JSON.stringify(body)}\n`, 0o644);
}
