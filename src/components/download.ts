import { untilAborted } from "../exec/until-aborted.js";
import { createHash } from "node:crypto";
import { constants, type Stats } from "node:fs";
import { open, stat, type FileHandle } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { errorMessage } from "../errors/error-message.js";
import { deadlineSignal } from "../exec/deadline-signal.js";
import { ComponentInstallError } from "./component-errors.js";
import { redactUrlsIn } from "./redact-url.js";

/**
 * What identifies the bytes a source served, to ask next time whether they changed. HTTP(S): the
 * `ETag` and `Last-Modified` the server sent (either may be missing; a server that sends neither
 * cannot be asked, and every install from it downloads in full). `file:`: the source file's
 * identity (device, inode, size, mtime and ctime in ns), compared without reading the file.
 */
export interface Validators {
  readonly etag?: string;
  readonly lastModified?: string;
  readonly file?: string;
}

/** How a download ended: the source said nothing changed, or the bytes are in the temp file. */
export type DownloadResult =
  | { readonly kind: "not-modified" }
  | {
      readonly kind: "fetched";
      /** The sha256 of the bytes written, lowercase hex. */
      readonly sha256: string;
      readonly size: number;
      /** What to ask with next time (empty when the source gave none). */
      readonly validators: Validators;
    };

/** One download's parameters. */
export interface DownloadRequest {
  readonly url: URL;
  /** A new file (created 0600, `wx`), written only when the source sends bytes. */
  readonly temp: string;
  /** The shim's shutdown: ends the download at once. */
  readonly shutdown: AbortSignal;
  readonly timeoutMs: number;
  /** Validators of the bytes last fetched from this URL: ask whether they changed. */
  readonly ifChanged?: Validators;
}

/** Whether validators hold anything to ask with. */
export function hasValidators(validators: Validators | undefined): validators is Validators {
  return (
    validators !== undefined &&
    (validators.etag !== undefined || validators.lastModified !== undefined || validators.file !== undefined)
  );
}

/** An ETag as RFC 9110 spells it (`"…"` or `W/"…"`), not a screenful. */
const ETAG = /^(?:W\/)?"[\x21\x23-\x7e]*"$/;
const MAX_ETAG_CHARS = 512;
/** An HTTP date is 29 characters; anything printable and short is sent back as it came. */
const LAST_MODIFIED = /^[\x20-\x7e]{1,64}$/;
const READ_CHUNK_BYTES = 64 * 1024;

/** A download's body, one chunk at a time. */
interface ChunkSource {
  /** The next chunk, or undefined at the end. */
  next(): Promise<Uint8Array | undefined>;
  /** Releases the source without waiting for it (a read may still be stuck in it). */
  close(): void;
}

/** An opened source: unchanged since the validators, or its bytes to read. */
type Opened =
  | { readonly kind: "not-modified" }
  | { readonly kind: "body"; readonly source: ChunkSource; readonly validators: Validators };

/**
 * Downloads `url` (http, https or file) under the download deadline, conditionally when
 * `ifChanged` holds validators. Unchanged: nothing is created. Changed (or not asked): the bytes
 * go to the new 0600 file `temp`, fsynced, with their sha256 and the source's new validators.
 * Throws a {@link ComponentInstallError}; the caller removes `temp`.
 */
export async function download(request: DownloadRequest): Promise<DownloadResult> {
  const { url, temp, shutdown, timeoutMs } = request;
  const ifChanged = hasValidators(request.ifChanged) ? request.ifChanged : undefined;
  using deadline = deadlineSignal(shutdown, timeoutMs);
  const signal = deadline.signal;
  const hash = createHash("sha256");
  let size = 0;
  let file: FileHandle | undefined;
  let source: ChunkSource | undefined;
  try {
    const opening = url.protocol === "file:" ? openFile(url, ifChanged) : openHttp(url, signal, ifChanged);
    const opened = await untilAborted(opening, signal).catch((error: unknown) => {
      // An open that ends after we gave up on it is closed then.
      void opening.then(
        (late) => (late.kind === "body" ? late.source.close() : undefined),
        () => undefined,
      );
      throw error;
    });
    if (opened.kind === "not-modified") return opened;
    source = opened.source;
    file = await open(temp, "wx", 0o600);
    for (;;) {
      // Each read races the signal: a peer that stalls mid-body, or a read stuck in the kernel,
      // cannot hold the install past its deadline or the shim's shutdown.
      const chunk = await untilAborted(source.next(), signal);
      if (chunk === undefined) break;
      hash.update(chunk);
      size += chunk.byteLength;
      await file.write(chunk);
    }
    await file.sync();
    return { kind: "fetched", sha256: hash.digest("hex"), size, validators: opened.validators };
  } catch (error) {
    if (signal.aborted) {
      throw shutdown.aborted
        ? new ComponentInstallError("shim shutting down", { cause: shutdown.reason })
        : new ComponentInstallError(`download did not finish within ${timeoutMs} ms`, { cause: error });
    }
    throw error;
  } finally {
    source?.close();
    await file?.close();
  }
}

/** An HTTP(S) answer's body, or `not-modified`; the signal aborts the request and the body. */
async function openHttp(url: URL, signal: AbortSignal, ifChanged: Validators | undefined): Promise<Opened> {
  const headers: Record<string, string> = {};
  if (ifChanged?.etag !== undefined) headers["if-none-match"] = ifChanged.etag;
  if (ifChanged?.lastModified !== undefined) headers["if-modified-since"] = ifChanged.lastModified;
  let response: Response;
  try {
    response = await fetch(url, { signal, redirect: "follow", headers });
  } catch (error) {
    const cause = error instanceof Error && error.cause !== undefined ? `: ${errorMessage(error.cause)}` : "";
    throw new ComponentInstallError(redactUrlsIn(`download failed: ${errorMessage(error)}${cause}`), {
      cause: error,
    });
  }
  const body = response.body;
  // A 304 to a request that asked nothing is a server's error, like any other status but 200.
  if (response.status === 304 && (ifChanged?.etag !== undefined || ifChanged?.lastModified !== undefined)) {
    void body?.cancel().catch(() => undefined);
    return { kind: "not-modified" };
  }
  if (response.status !== 200 || !body) {
    void body?.cancel().catch(() => undefined);
    throw new ComponentInstallError(`download failed: HTTP ${response.status}`);
  }
  const etag = response.headers.get("etag");
  const lastModified = response.headers.get("last-modified");
  const validators: Validators = {
    ...(etag !== null && etag.length <= MAX_ETAG_CHARS && ETAG.test(etag) ? { etag } : {}),
    ...(lastModified !== null && LAST_MODIFIED.test(lastModified) && !Number.isNaN(Date.parse(lastModified))
      ? { lastModified }
      : {}),
  };
  // Node's types give fetch's body as a stream of `any`; it is bytes.
  const reader = (body as ReadableStream<Uint8Array>).getReader();
  return {
    kind: "body",
    validators,
    source: {
      next: async () => {
        const { done, value } = await reader.read();
        return done ? undefined : value;
      },
      close: () => void reader.cancel().catch(() => undefined),
    },
  };
}

/**
 * A local regular file, or `not-modified` when it is still the file `ifChanged.file` names.
 * Anything else is refused before a byte is read: a FIFO (its open waits for a writer, and a
 * writer that closes at once makes an empty binary), a device (/dev/zero never ends; opening
 * some acts on them), a directory.
 */
async function openFile(url: URL, ifChanged: Validators | undefined): Promise<Opened> {
  let path: string;
  try {
    path = fileURLToPath(url);
  } catch (error) {
    throw new ComponentInstallError(`invalid file url: ${errorMessage(error)}`, { cause: error });
  }
  const unreadable = (error: unknown): ComponentInstallError =>
    new ComponentInstallError(`cannot read ${path}: ${errorMessage(error)}`, { cause: error });
  const kind = await stat(path).catch((error: unknown) => {
    throw unreadable(error);
  });
  if (!kind.isFile()) throw new ComponentInstallError(`${path} is not a regular file (${fileKind(kind)})`);
  // The path may have been replaced since: O_NONBLOCK keeps the open of a FIFO from waiting for
  // a writer, O_NOCTTY a terminal from becoming ours, and the fstat of what was opened decides.
  const handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY).catch(
    (error: unknown) => {
      throw unreadable(error);
    },
  );
  const opened = await handle.stat({ bigint: true }).catch(async (error: unknown) => {
    await handle.close();
    throw unreadable(error);
  });
  if (!opened.isFile()) {
    await handle.close();
    throw new ComponentInstallError(`${path} is not a regular file (${fileKind(opened)})`);
  }
  // No server to ask: the file's own identity stands for its bytes. A rewrite moves its mtime
  // and ctime, a copy renamed over it is another inode, so an unchanged identity is unchanged bytes.
  const identity = [opened.dev, opened.ino, opened.size, opened.mtimeNs, opened.ctimeNs].join(":");
  if (ifChanged?.file === identity) {
    await handle.close();
    return { kind: "not-modified" };
  }
  return { kind: "body", source: fileChunks(handle), validators: { file: identity } };
}

/** Reads an open regular file to its end, one chunk at a time. */
function fileChunks(handle: FileHandle): ChunkSource {
  return {
    next: async () => {
      const buffer = Buffer.allocUnsafe(READ_CHUNK_BYTES);
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
      return bytesRead === 0 ? undefined : buffer.subarray(0, bytesRead);
    },
    // A read still stuck in the kernel keeps the handle until it returns; Node closes it then.
    close: () => void handle.close().catch(() => undefined),
  };
}

/** What a non-regular file is, for the refusal's message. */
function fileKind(
  stats: Pick<Stats, "isFIFO" | "isCharacterDevice" | "isBlockDevice" | "isDirectory" | "isSocket">,
): string {
  if (stats.isFIFO()) return "a FIFO";
  if (stats.isCharacterDevice()) return "a character device";
  if (stats.isBlockDevice()) return "a block device";
  if (stats.isDirectory()) return "a directory";
  if (stats.isSocket()) return "a socket";
  return "not a file";
}
