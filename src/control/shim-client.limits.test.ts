import { createServer, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_ANSWER_BYTES, ShimAnswerTooLargeError, ShimClient, ShimHttpError } from "./shim-client.js";

/*
 * A fake peer whose bodies never end (or are merely huge): the client must stop reading at its
 * bound with a clear error, not buffer what it is sent until the heap is gone (it read 1.2 GB in
 * 9 s before the bound).
 */

const MiB = 1024 * 1024;
const CHUNK = Buffer.alloc(64 * 1024, "x");

/** Writes chunks until the client goes away; how many bytes it managed to send. */
function endless(res: ServerResponse, sent: { bytes: number }, prefix = ""): void {
  if (prefix !== "") res.write(prefix);
  const pump = (): void => {
    while (!res.destroyed) {
      sent.bytes += CHUNK.length;
      if (!res.write(CHUNK)) {
        res.once("drain", pump);
        return;
      }
    }
  };
  res.on("close", () => res.removeAllListeners("drain"));
  pump();
}

describe("D9 a shim URL that answers an endless body: the client reads at most its bound", () => {
  let server: Server;
  let base: string;
  const sent = { bytes: 0 };

  beforeAll(async () => {
    server = createServer((req, res) => {
      const url = req.url ?? "";
      if (url === "/api/tasks") {
        res.writeHead(200, { "content-type": "application/json" });
        endless(res, sent, '{"tasks":[{"id":"');
      } else if (url.startsWith("/api/tasks/t1/logs")) {
        res.writeHead(200, { "content-type": "text/plain" });
        endless(res, sent);
      } else if (url === "/api/tasks/t1") {
        // An error body that never ends either.
        res.writeHead(500, { "content-type": "text/plain" });
        endless(res, sent);
      } else if (url === "/api/events") {
        // One "line" that never ends.
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        endless(res, sent);
      } else if (url === "/metrics") {
        // Just under the bound: read whole.
        res.writeHead(200, { "content-type": "text/plain" });
        res.end(Buffer.alloc(MAX_ANSWER_BYTES - 10, "m"));
      } else {
        res.writeHead(404).end("not found\n");
      }
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it("D9 tasks ls: an endless JSON body ends in 'answer from <url> exceeds 16 MiB', heap bounded", async () => {
    const client = new ShimClient(base, 30_000);
    const heapBefore = process.memoryUsage().rss;
    sent.bytes = 0;
    const started = Date.now();
    const error = await client.listTasks().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ShimAnswerTooLargeError);
    expect((error as Error).message).toBe(`answer from ${base}/api/tasks exceeds 16 MiB`);
    // Stopped at the bound, not at the 30 s deadline.
    expect(Date.now() - started).toBeLessThan(15_000);
    // The peer could send only what fits in the socket buffers past the bound.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(sent.bytes).toBeLessThan(MAX_ANSWER_BYTES + 32 * MiB);
    expect(process.memoryUsage().rss - heapBefore).toBeLessThan(200 * MiB);
  });

  it("D9 logs and an endless error body: the same bound, never a ShimHttpError with a huge body", async () => {
    const client = new ShimClient(base, 30_000);
    await expect(client.logs("t1", 100)).rejects.toBeInstanceOf(ShimAnswerTooLargeError);
    const error = await client.getTask("t1").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ShimAnswerTooLargeError);
    expect(error).not.toBeInstanceOf(ShimHttpError);
  });

  it("D9 an event line that never ends: the stream ends with ShimAnswerTooLargeError", async () => {
    const client = new ShimClient(base, 30_000);
    const stop = new AbortController();
    const read = async (): Promise<unknown> => {
      for await (const event of client.events(stop.signal)) return event;
      return undefined;
    };
    const error = await read().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ShimAnswerTooLargeError);
    expect((error as Error).message).toBe(`answer from ${base}/api/events exceeds 1 MiB`);
  });

  it("an answer under the bound is read whole", async () => {
    const client = new ShimClient(base, 30_000);
    expect((await client.metrics()).length).toBe(MAX_ANSWER_BYTES - 10);
  });
});
