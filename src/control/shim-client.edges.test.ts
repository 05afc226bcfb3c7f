/*
 * The client's edges: the exact request each call sends, each way an answer is refused, the
 * bound on what it reads, and the event stream's lines.
 */
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import {
  MAX_ANSWER_BYTES,
  MAX_EVENT_LINE_BYTES,
  readLimitedText,
  ShimAnswerTooLargeError,
  ShimClient,
  ShimHttpError,
  ShimProtocolError,
  ShimUnreachableError,
  taskPath,
  UnaddressableTaskIdError,
} from "./shim-client.js";

interface Seen {
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}
type Reply = (seen: Seen, response: import("node:http").ServerResponse) => void;

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(
      (s) =>
        new Promise<void>((resolve) => {
          s.closeAllConnections();
          s.close(() => resolve());
        }),
    ),
  );
});

async function serve(reply: Reply): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const server = createServer((request, response) => {
    let body = "";
    request.setEncoding("utf8");
    request.on("data", (chunk: string) => (body += chunk));
    request.once("end", () => {
      const one = { method: request.method ?? "", url: request.url ?? "", headers: request.headers, body };
      seen.push(one);
      reply(one, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  servers.push(server);
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

const send =
  (status: number, body: unknown, type = "application/json"): Reply =>
  (_, response) =>
    response
      .writeHead(status, { "content-type": type })
      .end(typeof body === "string" ? body : JSON.stringify(body));
const TASK = { id: "t1", status: "running", termination_reason: "", termination_message: "" };
const failure = async (work: Promise<unknown>): Promise<Error> => {
  const error = await work.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(error instanceof Error)) throw new Error("it did not fail");
  return error;
};

describe("taskPath", () => {
  it("encodes the id whole, and refuses one a URL would resolve away", () => {
    expect(taskPath("t1")).toBe("/api/tasks/t1");
    expect(taskPath("a/b?c#d%", "/logs")).toBe("/api/tasks/a%2Fb%3Fc%23d%25/logs");
    expect(taskPath("...")).toBe("/api/tasks/...");
    for (const id of ["", ".", ".."]) {
      expect(() => taskPath(id)).toThrow(UnaddressableTaskIdError);
      expect(() => taskPath(id)).toThrow(
        `task id ${JSON.stringify(id)} cannot be sent in a request path (a URL resolves it away)`,
      );
    }
    expect(new UnaddressableTaskIdError("x").name).toBe("UnaddressableTaskIdError");
  });
});

describe("ShimClient requests", () => {
  it("sends JSON bodies (and their content type) only where a call has one", async () => {
    const shim = await serve((seen, response) => {
      if (seen.url.endsWith("/terminate")) return send(200, TASK)(seen, response);
      if (seen.url === "/api/tasks" && seen.method === "POST") return send(200, TASK)(seen, response);
      return send(200, "", "text/plain")(seen, response);
    });
    const client = new ShimClient(shim.url);
    await client.installComponent("dstack-shim", "https://x/y", "a".repeat(64));
    await client.installComponent("dstack-runner", "https://x/z");
    await client.installComponent("dstack-runner", "https://x/z", "");
    await client.shutdown(true);
    await client.terminateTask("t1");
    await client.submitTask({ id: "t1", name: "n" });
    await client.removeTask("t1");
    expect(await client.logs("t1")).toBe("");
    expect(
      shim.seen.map((s): unknown[] => [
        s.method,
        s.url,
        s.headers["content-type"],
        s.body === "" ? "" : (JSON.parse(s.body) as unknown),
      ]),
    ).toEqual([
      [
        "POST",
        "/api/components/install",
        "application/json",
        { name: "dstack-shim", url: "https://x/y", sha256: "a".repeat(64) },
      ],
      ["POST", "/api/components/install", "application/json", { name: "dstack-runner", url: "https://x/z" }],
      ["POST", "/api/components/install", "application/json", { name: "dstack-runner", url: "https://x/z" }],
      ["POST", "/api/shutdown", "application/json", { force: true }],
      [
        "POST",
        "/api/tasks/t1/terminate",
        "application/json",
        { termination_reason: "", termination_message: "", timeout: 10 },
      ],
      ["POST", "/api/tasks", "application/json", { id: "t1", name: "n" }],
      ["POST", "/api/tasks/t1/remove", undefined, ""],
      ["GET", "/api/tasks/t1/logs?tail=100", undefined, ""],
    ]);
    expect(shim.seen.every((s) => s.headers.authorization === undefined)).toBe(true);
  });

  it("names an HTTP error by method, path, status and the trimmed body; GET unless said", async () => {
    const shim = await serve(send(503, "  engine down \n", "text/plain"));
    const error = await failure(new ShimClient(shim.url).getTask("t1"));
    expect(error).toBeInstanceOf(ShimHttpError);
    expect(error).toMatchObject({
      name: "ShimHttpError",
      status: 503,
      body: "  engine down \n",
      path: "/api/tasks/t1",
      method: "GET",
      message: "GET /api/tasks/t1: HTTP 503: engine down",
    });
  });

  it("a submit answered 409 adopts the task only when it can be read; anything else is thrown as it came", async () => {
    const conflict = await serve((seen, response) =>
      seen.method === "POST"
        ? send(409, "exists", "text/plain")(seen, response)
        : send(500, "no", "text/plain")(seen, response),
    );
    const error = await failure(new ShimClient(conflict.url).submitTask({ id: "t1" }));
    expect(error).toMatchObject({ name: "ShimHttpError", status: 409 });
    expect(conflict.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      "POST /api/tasks",
      "GET /api/tasks/t1",
    ]);

    const broken = await serve(send(500, "no", "text/plain"));
    expect(await failure(new ShimClient(broken.url).submitTask({ id: "t1" }))).toMatchObject({ status: 500 });
    expect(broken.seen).toHaveLength(1);
  });

  it("refuses a 2xx answer that is not JSON, or not the contract's, naming the path", async () => {
    const text = await serve(send(200, "<html>", "text/html"));
    const notJson = await failure(new ShimClient(text.url).listTasks());
    expect(notJson).toBeInstanceOf(ShimProtocolError);
    expect(notJson.message).toBe("/api/tasks: response is not JSON");
    expect(notJson.name).toBe("ShimProtocolError");
    const other = await serve(send(200, { tasks: [{ id: "t1", status: "sleeping" }] }));
    const wrong = await failure(new ShimClient(other.url).listTasks());
    expect(wrong).toBeInstanceOf(ShimProtocolError);
    expect(wrong.message).toMatch(/^\/api\/tasks: unexpected response: \/tasks\/0\/status \S/);
  });

  it("an unreachable shim, or one that does not answer in time, is unreachable with the URL and why", async () => {
    const silent = await serve(() => undefined);
    const late = await failure(new ShimClient(silent.url, 100).listTasks());
    expect(late).toBeInstanceOf(ShimUnreachableError);
    expect(late.name).toBe("ShimUnreachableError");
    expect(late.message).toBe(`${silent.url}/api/tasks: no answer within the deadline`);
  });

  it("negotiates once, and an old API is never safe to restart", async () => {
    const old = await serve((seen, response) =>
      seen.url === "/api/healthcheck"
        ? send(200, { service: "dstack-shim", version: "0.18.0" })(seen, response)
        : send(200, { tasks: [] })(seen, response),
    );
    const client = new ShimClient(old.url);
    expect(await client.isSafeToRestart()).toEqual({ safe: false, blocking: [] });
    expect(await client.negotiate()).toMatchObject({ apiVersion: 1 });
    expect(old.seen.map((s) => s.url)).toEqual(["/api/healthcheck"]);
  });
});

describe("readLimitedText", () => {
  const chunked = (...chunks: Uint8Array[]): Response =>
    new Response(
      new ReadableStream<Uint8Array>({
        start(controller) {
          for (const chunk of chunks) controller.enqueue(chunk);
          controller.close();
        },
      }),
    );

  it("reads a body of up to the limit, decoding UTF-8 split across chunks; no body is empty", async () => {
    const euro = Buffer.from("€");
    expect(
      await readLimitedText(chunked(euro.subarray(0, 1), euro.subarray(1), Buffer.from("ab")), "u", 5),
    ).toBe("€ab");
    expect(await readLimitedText(new Response(null), "u", 0)).toBe("");
    expect(MAX_ANSWER_BYTES).toBe(16 * 1024 * 1024);
    expect(MAX_EVENT_LINE_BYTES).toBe(1024 * 1024);
  });

  it("one byte past the limit is refused, naming the URL and the limit in MiB, and the body is cancelled", async () => {
    let cancelled = false;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.enqueue(Buffer.alloc(64 * 1024));
      },
      cancel() {
        cancelled = true;
      },
    });
    const error = await failure(readLimitedText(new Response(body), "http://h/x", 1.5 * 1024 * 1024));
    expect(error).toBeInstanceOf(ShimAnswerTooLargeError);
    expect(error).toMatchObject({
      name: "ShimAnswerTooLargeError",
      url: "http://h/x",
      limitBytes: 1.5 * 1024 * 1024,
      message: "answer from http://h/x exceeds 1.5 MiB",
    });
    expect(cancelled).toBe(true);
    expect(await failure(readLimitedText(chunked(Buffer.from("abcd")), "u", 3))).toMatchObject({
      message: "answer from u exceeds 0 MiB",
    });
  });
});

describe("ShimClient.events", () => {
  const event = (id: string): object => ({
    time: "2026-01-01T00:00:00Z",
    kind: "added",
    id,
    from: null,
    to: "pending",
  });

  it("yields each line's event, skipping blank lines, with the token sent", async () => {
    const shim = await serve((_, response) => {
      response.writeHead(200, { "content-type": "application/x-ndjson" });
      response.write(`${JSON.stringify(event("a"))}\n\n  \r\n${JSON.stringify(event("b")).slice(0, 10)}`);
      response.end(`${JSON.stringify(event("b")).slice(10)}\n`);
    });
    const ids: string[] = [];
    for await (const e of new ShimClient(shim.url, 9_000, { authToken: "tok" }).events(
      new AbortController().signal,
    ))
      ids.push(e.id);
    expect(ids).toEqual(["a", "b"]);
    expect(shim.seen[0]?.headers.authorization).toBe("Bearer tok");
  });

  it("a line that is not JSON, or not an event, ends the stream with a protocol error", async () => {
    for (const [line, message] of [
      ["{nope", "/api/events: a line is not JSON"],
      [JSON.stringify({ id: "a" }), "/api/events: unexpected event"],
    ] as const) {
      const shim = await serve(send(200, `${line}\n`, "application/x-ndjson"));
      const error = await failure(
        (async () => {
          for await (const _ of new ShimClient(shim.url).events(new AbortController().signal)) void _;
        })(),
      );
      expect(error).toBeInstanceOf(ShimProtocolError);
      expect(error.message).toBe(message);
    }
  });

  it("an HTTP error is thrown with its body; a stream aborted before it starts yields nothing", async () => {
    const shim = await serve(send(500, "broken", "text/plain"));
    const error = await failure(new ShimClient(shim.url).events(new AbortController().signal).next());
    expect(error).toMatchObject({
      name: "ShimHttpError",
      status: 500,
      message: "GET /api/events: HTTP 500: broken",
    });
    const stopped = new AbortController();
    stopped.abort();
    expect(await new ShimClient(shim.url).events(stopped.signal).next()).toEqual({
      done: true,
      value: undefined,
    });
  });

  it("no headers within the deadline: unreachable, saying so", async () => {
    const silent = await serve(() => undefined);
    const error = await failure(new ShimClient(silent.url, 100).events(new AbortController().signal).next());
    expect(error).toBeInstanceOf(ShimUnreachableError);
    expect(error.message).toBe(`${silent.url}/api/events: no answer within the deadline`);
  });
});
