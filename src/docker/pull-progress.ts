import { StringDecoder } from "node:string_decoder";
import { errorMessage } from "../errors/error-message.js";
import type { ImagePullProgress } from "../tasks/task-parts.js";

/**
 * One line of Docker's `POST /images/create` NDJSON stream (moby's `jsonmessage.JSONMessage`),
 * reduced to the fields the shim reads. Fields of the wrong type are dropped while parsing.
 */
export interface PullMessage {
  /** Layer id (short digest) for layer events; a tag or absent for image-level events. */
  id?: string;
  status?: string;
  progressDetail?: { current?: number; total?: number; units?: string };
  error?: string;
  errorDetail?: { message?: string };
}

interface LayerProgress {
  status: string;
  downloadedBytes: number;
  extractedBytes: number;
  totalBytes: number;
}

const ALREADY_EXISTS = "Already exists";
const PULL_COMPLETE = "Pull complete";

/** Per moby's `jsonstream.Progress`, empty units mean bytes. */
function isUnitBytes(detail: PullMessage["progressDetail"]): boolean {
  const units = detail?.units;
  return units === undefined || units === "" || units === "bytes";
}

/**
 * Aggregates per-layer pull progress exactly like dstack-shim's `PullTracker`, so the server sees
 * the same `image_pull_progress` numbers from either shim.
 */
export class PullTracker {
  private readonly layers = new Map<string, LayerProgress>();

  /** Folds one pull message into the per-layer state. Messages without a layer id are ignored. */
  update(message: PullMessage): void {
    const id = message.id;
    if (id === undefined || id === "") return;
    const status = message.status ?? "";
    const layer = this.layers.get(id) ?? { status: "", downloadedBytes: 0, extractedBytes: 0, totalBytes: 0 };
    const detail = message.progressDetail;
    switch (status) {
      case "Pulling fs layer":
      case "Waiting":
      case "Verifying Checksum":
      case ALREADY_EXISTS:
        break;
      case "Downloading":
        if (isUnitBytes(detail)) {
          layer.downloadedBytes = detail?.current ?? 0;
          layer.totalBytes = detail?.total ?? 0;
        }
        break;
      case "Download complete":
        layer.downloadedBytes = layer.totalBytes;
        break;
      case "Extracting":
        // Newer dockerd reports extraction in seconds; those numbers are not bytes and would corrupt the sums.
        if (isUnitBytes(detail)) {
          layer.extractedBytes = detail?.current ?? 0;
          layer.downloadedBytes = detail?.total ?? 0;
          layer.totalBytes = detail?.total ?? 0;
        }
        break;
      case PULL_COMPLETE:
        layer.extractedBytes = layer.totalBytes;
        layer.downloadedBytes = layer.totalBytes;
        break;
      default:
        // Image-level events such as {"status":"Pulling from library/python","id":"3.11"} are not layers.
        return;
    }
    layer.status = status;
    this.layers.set(id, layer);
  }

  /** The sums over all layers seen so far, or `null` before the first layer event. */
  progress(): ImagePullProgress | null {
    if (this.layers.size === 0) return null;
    const result: ImagePullProgress = {
      downloaded_bytes: 0,
      extracted_bytes: 0,
      total_bytes: 0,
      is_total_bytes_final: true,
    };
    for (const layer of this.layers.values()) {
      if (layer.totalBytes === 0 && layer.status !== ALREADY_EXISTS && layer.status !== PULL_COMPLETE) {
        result.is_total_bytes_final = false;
      }
      result.downloaded_bytes += layer.downloadedBytes;
      result.extracted_bytes += layer.extractedBytes;
      result.total_bytes += layer.totalBytes;
    }
    return result;
  }
}

/** The pull failed: the registry or daemon reported an error in the stream, or the stream broke. */
export class PullFailedError extends Error {
  override readonly name = "PullFailedError";
  /** The error text reported in the stream (`errorDetail.message` or `error`), if any. */
  readonly registryError: string | undefined;

  constructor(message: string, options?: { cause?: unknown; registryError?: string }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.registryError = options?.registryError;
  }
}

/** The pull stream ended without the final `Status: …` line, so the image may not be complete. */
export class PullIncompleteError extends Error {
  override readonly name = "PullIncompleteError";

  constructor(
    /** The last `status` seen in the stream, for the error report. */
    readonly lastSeenStatus: string | undefined,
  ) {
    super(
      lastSeenStatus === undefined
        ? "image pull stream ended without a final status"
        : `image pull stream ended without a final status (last status: ${JSON.stringify(lastSeenStatus)})`,
    );
  }
}

/**
 * Lines longer than this (in UTF-16 code units) are skipped unread: a pull line is a few hundred
 * characters, and buffering an unbounded line would let a broken daemon or proxy exhaust memory.
 */
export const MAX_PULL_LINE_LENGTH = 1024 * 1024;

/** Options of {@link consumePullStream}. */
export interface ConsumePullStreamOptions {
  /**
   * Called for every well-formed line, in order, including the line that fails the pull.
   * `rawLine` is the line as received, without its line terminator. A throw rejects the pull.
   */
  onMessage: (message: PullMessage, rawLine: string) => void;
  /** Aborting destroys the stream and rejects with `signal.reason`. */
  signal?: AbortSignal;
}

/** The result of a pull stream that ended with a `Status: …` line. */
export interface PullStreamResult {
  complete: true;
  /** The last `Status: …` line, e.g. `Status: Downloaded newer image for ubuntu:latest`. */
  lastStatus: string;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isFinite(value) && value >= 0;
}

/** Keeps only well-typed fields; `undefined` if the value is not a JSON object. */
function toPullMessage(value: unknown): PullMessage | undefined {
  if (!isRecord(value)) return undefined;
  const message: PullMessage = {};
  if (typeof value.id === "string") message.id = value.id;
  if (typeof value.status === "string") message.status = value.status;
  const detail = value.progressDetail;
  if (isRecord(detail)) {
    const progressDetail: NonNullable<PullMessage["progressDetail"]> = {};
    if (isCount(detail.current)) progressDetail.current = detail.current;
    if (isCount(detail.total)) progressDetail.total = detail.total;
    if (typeof detail.units === "string") progressDetail.units = detail.units;
    message.progressDetail = progressDetail;
  }
  // An error of an unexpected shape must still fail the pull, so it is kept as text rather than dropped.
  if (typeof value.error === "string") message.error = value.error;
  else if (value.error !== undefined && value.error !== null) message.error = JSON.stringify(value.error);
  const errorDetail = value.errorDetail;
  if (isRecord(errorDetail)) {
    message.errorDetail = typeof errorDetail.message === "string" ? { message: errorDetail.message } : {};
  }
  return message;
}

/** The error text of a failing message, or `undefined` if the message reports no error. */
function errorText(message: PullMessage): string | undefined {
  const detail = message.errorDetail?.message;
  if (detail !== undefined && detail !== "") return detail;
  if (message.error !== undefined && message.error !== "") return message.error;
  // moby sets errorDetail only on failure, and the docker CLI fails on its mere presence.
  return message.errorDetail === undefined ? undefined : "unknown error";
}

function destroyStream(stream: NodeJS.ReadableStream): void {
  const destroy = (stream as { destroy?: unknown }).destroy;
  if (typeof destroy === "function") destroy.call(stream);
}

function noop(): void {}

/**
 * Reads Docker's image pull NDJSON stream to its end.
 *
 * Resolves only if a line with a status starting with `Status:` was seen and no line reported an
 * error. Unlike dockerode's `followProgress`, a mid-stream `{"errorDetail":…,"error":…}` line fails
 * the pull ({@link PullFailedError}), malformed or overlong lines are skipped instead of throwing,
 * and a stream that ends without the final status rejects with {@link PullIncompleteError}. On any
 * rejection the stream is destroyed, which also releases the HTTP connection.
 */
export function consumePullStream(
  stream: NodeJS.ReadableStream,
  options: ConsumePullStreamOptions,
): Promise<PullStreamResult> {
  const { onMessage, signal } = options;
  return new Promise<PullStreamResult>((resolve, reject) => {
    const decoder = new StringDecoder("utf8");
    let buffered = "";
    let discarding = false;
    let settled = false;
    let lastStatus: string | undefined;
    let finalStatus: string | undefined;

    const detach = (): void => {
      stream.removeListener("data", onData);
      stream.removeListener("end", onEnd);
      stream.removeListener("close", onClose);
      stream.removeListener("error", onError);
      signal?.removeEventListener("abort", onAbort);
      // A destroyed socket may still emit "error"; without a listener that would be an uncaught exception.
      stream.on("error", noop);
    };

    const fail = (error: unknown): void => {
      if (settled) return;
      settled = true;
      detach();
      destroyStream(stream);
      // An abort must surface the signal's own reason, which may be any value.
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors
      reject(error);
    };

    const finish = (): void => {
      if (settled) return;
      if (finalStatus === undefined) {
        fail(new PullIncompleteError(lastStatus));
        return;
      }
      settled = true;
      detach();
      resolve({ complete: true, lastStatus: finalStatus });
    };

    const handleLine = (line: string): void => {
      const rawLine = line.endsWith("\r") ? line.slice(0, -1) : line;
      if (rawLine.trim() === "") return;
      let parsed: unknown;
      try {
        parsed = JSON.parse(rawLine);
      } catch {
        return;
      }
      const message = toPullMessage(parsed);
      if (message === undefined) return;
      onMessage(message, rawLine);
      const failure = errorText(message);
      if (failure !== undefined) {
        fail(new PullFailedError(`image pull failed: ${failure}`, { registryError: failure }));
        return;
      }
      if (message.status !== undefined) {
        lastStatus = message.status;
        if (message.status.startsWith("Status:")) finalStatus = message.status;
      }
    };

    const handleText = (text: string): void => {
      let start = 0;
      while (!settled) {
        const newline = text.indexOf("\n", start);
        if (newline === -1) {
          const rest = text.slice(start);
          if (discarding) break;
          if (buffered.length + rest.length > MAX_PULL_LINE_LENGTH) {
            buffered = "";
            discarding = true;
          } else {
            buffered += rest;
          }
          break;
        }
        const piece = text.slice(start, newline);
        start = newline + 1;
        if (discarding) {
          discarding = false;
        } else if (buffered.length + piece.length > MAX_PULL_LINE_LENGTH) {
          buffered = "";
        } else {
          const line = buffered + piece;
          buffered = "";
          handleLine(line);
        }
      }
    };

    function onData(chunk: string | Buffer): void {
      try {
        handleText(decoder.write(chunk));
      } catch (error) {
        fail(error);
      }
    }

    function onEnd(): void {
      try {
        handleText(decoder.end());
        // The last line needs no terminator.
        if (!settled && !discarding && buffered !== "") {
          const line = buffered;
          buffered = "";
          handleLine(line);
        }
      } catch (error) {
        fail(error);
        return;
      }
      finish();
    }

    // "close" without "end": the stream was destroyed early. A partial trailing line is not trusted.
    function onClose(): void {
      finish();
    }

    function onError(error: unknown): void {
      const reason = errorMessage(error);
      fail(new PullFailedError(`image pull stream failed: ${reason}`, { cause: error }));
    }

    function onAbort(): void {
      fail(signal?.reason);
    }

    if (signal?.aborted) {
      fail(signal.reason);
      return;
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    stream.on("error", onError);
    stream.on("end", onEnd);
    stream.on("close", onClose);
    stream.on("data", onData);
  });
}
