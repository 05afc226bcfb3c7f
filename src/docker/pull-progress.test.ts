import { PassThrough, Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import {
  consumePullStream,
  MAX_PULL_LINE_LENGTH,
  PullFailedError,
  PullIncompleteError,
  PullTracker,
} from "./pull-progress.js";
import type { PullMessage } from "./pull-progress.js";
import type { ImagePullProgress } from "../tasks/task-parts.js";

function progress(
  downloaded: number,
  extracted: number,
  total: number,
  isTotalBytesFinal: boolean,
): ImagePullProgress {
  return {
    downloaded_bytes: downloaded,
    extracted_bytes: extracted,
    total_bytes: total,
    is_total_bytes_final: isTotalBytesFinal,
  };
}

function bytes(status: string, id: string, current: number, total: number): PullMessage {
  return { id, status, progressDetail: { current, total } };
}

describe("PullTracker", () => {
  it("Empty: no layers gives null", () => {
    const tracker = new PullTracker();
    expect(tracker.progress()).toBeNull();
    tracker.update({ status: "Pulling from library/ubuntu", id: "latest" });
    tracker.update({ status: "Digest: sha256:abc" });
    tracker.update({ status: "Status: Image is up to date for ubuntu:latest" });
    tracker.update({ id: "", status: "Downloading", progressDetail: { current: 5, total: 10 } });
    expect(tracker.progress()).toBeNull();
  });

  it("AlreadyExists: zeros, final", () => {
    const tracker = new PullTracker();
    tracker.update({ id: "aaa", status: "Already exists" });
    tracker.update({ id: "bbb", status: "Already exists" });
    expect(tracker.progress()).toEqual(progress(0, 0, 0, true));
  });

  it("FullPull: two layers of 111 and 222 bytes, step by step", () => {
    const tracker = new PullTracker();
    const steps: [PullMessage, ImagePullProgress | null][] = [
      [{ id: "latest", status: "Pulling from library/ubuntu" }, null],
      [{ id: "aaa", status: "Pulling fs layer", progressDetail: {} }, progress(0, 0, 0, false)],
      [{ id: "bbb", status: "Pulling fs layer", progressDetail: {} }, progress(0, 0, 0, false)],
      [{ id: "bbb", status: "Waiting", progressDetail: {} }, progress(0, 0, 0, false)],
      [bytes("Downloading", "aaa", 50, 111), progress(50, 0, 111, false)],
      [bytes("Downloading", "aaa", 111, 111), progress(111, 0, 111, false)],
      [{ id: "aaa", status: "Verifying Checksum", progressDetail: {} }, progress(111, 0, 111, false)],
      [{ id: "aaa", status: "Download complete", progressDetail: {} }, progress(111, 0, 111, false)],
      // Every size is known from here on.
      [bytes("Downloading", "bbb", 100, 222), progress(211, 0, 333, true)],
      [bytes("Extracting", "aaa", 64, 111), progress(211, 64, 333, true)],
      [{ id: "aaa", status: "Pull complete", progressDetail: {} }, progress(211, 111, 333, true)],
      [{ id: "bbb", status: "Verifying Checksum", progressDetail: {} }, progress(211, 111, 333, true)],
      [{ id: "bbb", status: "Download complete", progressDetail: {} }, progress(333, 111, 333, true)],
      [bytes("Extracting", "bbb", 200, 222), progress(333, 311, 333, true)],
      [bytes("Extracting", "bbb", 222, 222), progress(333, 333, 333, true)],
      [{ id: "bbb", status: "Pull complete", progressDetail: {} }, progress(333, 333, 333, true)],
      [{ status: "Digest: sha256:0123" }, progress(333, 333, 333, true)],
      [{ status: "Status: Downloaded newer image for ubuntu:latest" }, progress(333, 333, 333, true)],
    ];
    for (const [message, expected] of steps) {
      tracker.update(message);
      expect(tracker.progress(), JSON.stringify(message)).toEqual(expected);
    }
  });

  it("MixedLayerStatuses: sums across layers, not final while a size is unknown", () => {
    const tracker = new PullTracker();
    tracker.update({ id: "cached", status: "Already exists" });
    tracker.update(bytes("Downloading", "done", 40, 100));
    tracker.update({ id: "done", status: "Download complete" });
    tracker.update({ id: "done", status: "Pull complete" });
    tracker.update(bytes("Downloading", "half", 150, 200));
    tracker.update({ id: "queued", status: "Pulling fs layer" });
    expect(tracker.progress()).toEqual(progress(250, 100, 300, false));

    tracker.update({ id: "queued", status: "Waiting" });
    expect(tracker.progress()).toEqual(progress(250, 100, 300, false));
  });

  it("NonBytesExtractingUnit: seconds are ignored, Pull complete sets extracted = total", () => {
    const tracker = new PullTracker();
    tracker.update(bytes("Downloading", "aaa", 100, 100));
    tracker.update({ id: "aaa", status: "Download complete" });
    tracker.update({ id: "aaa", status: "Extracting", progressDetail: { current: 1, units: "s" } });
    tracker.update({ id: "aaa", status: "Extracting", progressDetail: { current: 3, total: 9, units: "s" } });
    expect(tracker.progress()).toEqual(progress(100, 0, 100, true));
    tracker.update({ id: "aaa", status: "Pull complete" });
    expect(tracker.progress()).toEqual(progress(100, 100, 100, true));
  });

  it("counts explicit bytes units and ignores non-bytes download units", () => {
    const tracker = new PullTracker();
    tracker.update({
      id: "aaa",
      status: "Downloading",
      progressDetail: { current: 7, total: 70, units: "bytes" },
    });
    tracker.update({
      id: "bbb",
      status: "Downloading",
      progressDetail: { current: 7, total: 70, units: "s" },
    });
    expect(tracker.progress()).toEqual(progress(7, 0, 70, false));
  });

  it("Extracting without download progress takes the total from the extraction", () => {
    const tracker = new PullTracker();
    tracker.update({ id: "aaa", status: "Pulling fs layer" });
    tracker.update(bytes("Extracting", "aaa", 32, 96));
    expect(tracker.progress()).toEqual(progress(96, 32, 96, true));
  });

  it("a completed layer whose size was never reported keeps the total final", () => {
    const tracker = new PullTracker();
    tracker.update({ id: "aaa", status: "Pulling fs layer" });
    expect(tracker.progress()).toEqual(progress(0, 0, 0, false));
    tracker.update({ id: "aaa", status: "Pull complete" });
    expect(tracker.progress()).toEqual(progress(0, 0, 0, true));
  });

  it("an image-level status with a layer-like id does not reset the layer", () => {
    const tracker = new PullTracker();
    tracker.update(bytes("Downloading", "aaa", 10, 20));
    tracker.update({ id: "aaa", status: "Retrying in 5 seconds" });
    expect(tracker.progress()).toEqual(progress(10, 0, 20, true));
  });

  it("returns a fresh object on each call", () => {
    const tracker = new PullTracker();
    tracker.update({ id: "aaa", status: "Already exists" });
    const first = tracker.progress();
    if (first) first.total_bytes = 999;
    expect(tracker.progress()).toEqual(progress(0, 0, 0, true));
  });
});

const FINAL = '{"status":"Status: Downloaded newer image for ubuntu:latest"}';

interface Collected {
  messages: PullMessage[];
  rawLines: string[];
  onMessage: (message: PullMessage, rawLine: string) => void;
}

function collector(): Collected {
  const messages: PullMessage[] = [];
  const rawLines: string[] = [];
  return {
    messages,
    rawLines,
    onMessage: (message, rawLine) => {
      messages.push(message);
      rawLines.push(rawLine);
    },
  };
}

describe("consumePullStream", () => {
  it("reads a full pull, joining lines split across chunks and multibyte characters", async () => {
    const euro = Buffer.from("€", "utf8");
    const chunks = [
      Buffer.from('{"status":"Pulling from library/ubuntu","id":"latest"}\n{"status":"Pulling fs la'),
      Buffer.from('yer","progressDetail":{},"id":"aaa"}\n'),
      Buffer.from('{"status":"Downloading","progressDetail":{"current":111,"total":111},"id":"aaa"}\r\n\n'),
      Buffer.concat([Buffer.from('{"status":"Pull complete","id":"aaa","note":"'), euro.subarray(0, 1)]),
      Buffer.concat([euro.subarray(1), Buffer.from('"}\n{"status":"Digest: sha256:0123"}\n')]),
      Buffer.from(FINAL), // no trailing newline
    ];
    const stream = Readable.from(chunks);
    const seen = collector();
    const tracker = new PullTracker();

    const result = await consumePullStream(stream, {
      onMessage: (message, rawLine) => {
        seen.onMessage(message, rawLine);
        tracker.update(message);
      },
    });

    expect(result).toEqual({
      complete: true,
      lastStatus: "Status: Downloaded newer image for ubuntu:latest",
    });
    expect(seen.messages.map((m) => m.status)).toEqual([
      "Pulling from library/ubuntu",
      "Pulling fs layer",
      "Downloading",
      "Pull complete",
      "Digest: sha256:0123",
      "Status: Downloaded newer image for ubuntu:latest",
    ]);
    expect(seen.rawLines[1]).toBe('{"status":"Pulling fs layer","progressDetail":{},"id":"aaa"}');
    expect(seen.rawLines[2]).toBe(
      '{"status":"Downloading","progressDetail":{"current":111,"total":111},"id":"aaa"}',
    );
    expect(seen.rawLines[3]).toBe('{"status":"Pull complete","id":"aaa","note":"€"}');
    expect(seen.messages[2]).toEqual({
      status: "Downloading",
      id: "aaa",
      progressDetail: { current: 111, total: 111 },
    });
    expect(tracker.progress()).toEqual(progress(111, 111, 111, true));
  });

  it("accepts string chunks", async () => {
    const stream = Readable.from([
      '{"status":"Pulling from x","id":"1"}\n{"sta',
      'tus":"Status: Image is up to date"}\n',
    ]);
    const result = await consumePullStream(stream, { onMessage: () => {} });
    expect(result.lastStatus).toBe("Status: Image is up to date");
  });

  it("ignores malformed lines and drops ill-typed fields", async () => {
    const seen = collector();
    const stream = Readable.from([
      "not json\n",
      "{\n",
      "[1,2,3]\n",
      "null\n",
      '"Status: a string, not an object"\n',
      '{"status":5,"id":["x"],"progressDetail":{"current":"10","total":-1,"units":7}}\n',
      '{"status":"Downloading","id":"aaa","progressDetail":"bad"}\n',
      "   \n",
      FINAL + "\n",
    ]);
    const result = await consumePullStream(stream, { onMessage: seen.onMessage });
    expect(result.complete).toBe(true);
    expect(seen.messages).toEqual([
      { progressDetail: {} },
      { status: "Downloading", id: "aaa" },
      { status: "Status: Downloaded newer image for ubuntu:latest" },
    ]);
  });

  it("fails on a mid-stream error line after progress, after reporting it", async () => {
    const seen = collector();
    const errorLine = '{"errorDetail":{"message":"unknown blob"},"error":"unknown blob"}';
    const stream = Readable.from([
      '{"status":"Downloading","progressDetail":{"current":10,"total":100},"id":"aaa"}\n',
      errorLine + "\n",
      FINAL + "\n",
    ]);
    const error = await consumePullStream(stream, { onMessage: seen.onMessage }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PullFailedError);
    expect((error as PullFailedError).message).toContain("unknown blob");
    expect((error as PullFailedError).registryError).toBe("unknown blob");
    expect((error as PullFailedError).name).toBe("PullFailedError");
    expect(seen.rawLines).toEqual([expect.stringContaining("Downloading"), errorLine]);
    expect(stream.destroyed).toBe(true);
  });

  it("fails on an error line even after the final status", async () => {
    const stream = Readable.from([FINAL + "\n", '{"error":"late failure"}\n']);
    await expect(consumePullStream(stream, { onMessage: () => {} })).rejects.toThrow(
      /image pull failed: late failure/,
    );
  });

  it.each([
    ['{"error":"only error"}', "only error"],
    ['{"errorDetail":{"message":"only detail"}}', "only detail"],
    ['{"errorDetail":{"message":"detail wins"},"error":"plain"}', "detail wins"],
    ['{"errorDetail":{}}', "unknown error"],
    ['{"error":{"code":1}}', '{"code":1}'],
  ])("treats %s as a failure", async (line, text) => {
    const stream = Readable.from([line + "\n"]);
    const error = await consumePullStream(stream, { onMessage: () => {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PullFailedError);
    expect((error as PullFailedError).registryError).toBe(text);
  });

  it("rejects with PullIncompleteError when the final status is missing", async () => {
    const stream = Readable.from([
      '{"status":"Pulling fs layer","id":"aaa"}\n',
      '{"status":"Downloading","progressDetail":{"current":1,"total":2},"id":"aaa"}\n',
      '{"status":"Digest: sha256:0123"}\n',
    ]);
    const error = await consumePullStream(stream, { onMessage: () => {} }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PullIncompleteError);
    expect((error as PullIncompleteError).lastSeenStatus).toBe("Digest: sha256:0123");
  });

  it("rejects with PullIncompleteError on an empty stream", async () => {
    await expect(consumePullStream(Readable.from([]), { onMessage: () => {} })).rejects.toBeInstanceOf(
      PullIncompleteError,
    );
  });

  it("rejects with PullIncompleteError when the stream closes early without an error", async () => {
    const stream = new PassThrough();
    const pending = consumePullStream(stream, { onMessage: () => {} });
    stream.write('{"status":"Downloading","id":"aaa"}\n');
    // A partial line at an early close is not trusted, even if it would be the final status.
    stream.write('{"status":"Status: Downloaded"}');
    await new Promise((resolve) => setImmediate(resolve));
    stream.destroy();
    await expect(pending).rejects.toBeInstanceOf(PullIncompleteError);
  });

  it("skips an overlong line without buffering it, then goes on", async () => {
    const seen = collector();
    const half = "x".repeat(MAX_PULL_LINE_LENGTH / 2 + 1);
    const stream = Readable.from([
      '{"error":"' + half,
      half,
      half + '"}\n{"status":"Pulling fs layer","id":"aaa"}\n',
      '{"status":"' + "y".repeat(MAX_PULL_LINE_LENGTH) + '"}\n',
      FINAL,
    ]);
    const result = await consumePullStream(stream, { onMessage: seen.onMessage });
    expect(result.complete).toBe(true);
    expect(seen.messages.map((m) => m.status)).toEqual([
      "Pulling fs layer",
      "Status: Downloaded newer image for ubuntu:latest",
    ]);
  });

  it("accepts a line of exactly the maximum length", async () => {
    const status = "Status: " + "z".repeat(MAX_PULL_LINE_LENGTH - '{"status":"Status: "}'.length);
    const line = JSON.stringify({ status });
    expect(line).toHaveLength(MAX_PULL_LINE_LENGTH);
    const result = await consumePullStream(Readable.from([line.slice(0, 10), line.slice(10) + "\n"]), {
      onMessage: () => {},
    });
    expect(result.lastStatus).toBe(status);
  });

  it("aborts: destroys the stream and rejects with the signal's reason", async () => {
    const stream = new PassThrough();
    const controller = new AbortController();
    const seen = collector();
    const pending = consumePullStream(stream, { onMessage: seen.onMessage, signal: controller.signal });
    stream.write('{"status":"Downloading","progressDetail":{"current":1,"total":2},"id":"aaa"}\n');
    await new Promise((resolve) => setImmediate(resolve));
    const reason = new Error("task terminated");
    controller.abort(reason);
    await expect(pending).rejects.toBe(reason);
    expect(seen.messages).toHaveLength(1);
    expect(stream.destroyed).toBe(true);
    // A late error from the destroyed connection must not become an uncaught exception.
    expect(() => stream.emit("error", new Error("ECONNRESET"))).not.toThrow();
  });

  it("rejects at once with an already aborted signal", async () => {
    const stream = new PassThrough();
    const reason = new Error("shutting down");
    const seen = collector();
    await expect(
      consumePullStream(stream, { onMessage: seen.onMessage, signal: AbortSignal.abort(reason) }),
    ).rejects.toBe(reason);
    expect(stream.destroyed).toBe(true);
    expect(seen.messages).toHaveLength(0);
  });

  it("wraps a stream error in PullFailedError with the cause", async () => {
    const stream = new PassThrough();
    const pending = consumePullStream(stream, { onMessage: () => {} });
    stream.write('{"status":"Downloading","id":"aaa"}\n');
    const cause = new Error("socket hang up");
    stream.destroy(cause);
    const error = await pending.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PullFailedError);
    expect((error as PullFailedError).message).toContain("socket hang up");
    expect((error as PullFailedError).cause).toBe(cause);
    expect((error as PullFailedError).registryError).toBeUndefined();
  });

  it("rejects with the callback's error when onMessage throws", async () => {
    const stream = Readable.from([FINAL + "\n"]);
    const boom = new Error("pull.log is full");
    await expect(
      consumePullStream(stream, {
        onMessage: () => {
          throw boom;
        },
      }),
    ).rejects.toBe(boom);
    expect(stream.destroyed).toBe(true);
  });

  it("keeps the last of several final statuses", async () => {
    const stream = Readable.from(['{"status":"Status: first"}\n', '{"status":"Status: second"}\n']);
    const result = await consumePullStream(stream, { onMessage: () => {} });
    expect(result.lastStatus).toBe("Status: second");
  });
});

describe("errors", () => {
  it("have names and messages", () => {
    expect(new PullIncompleteError(undefined).message).toBe("image pull stream ended without a final status");
    expect(new PullIncompleteError("Waiting").message).toContain('"Waiting"');
    expect(new PullIncompleteError(undefined).name).toBe("PullIncompleteError");
    expect(new PullFailedError("x").cause).toBeUndefined();
  });
});
