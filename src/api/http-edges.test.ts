import { connect } from "node:net";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { oneLineMessage } from "./replies.js";
import { buildTestApi } from "../testing/test-api.js";

let env: TestEnv;
let app: ReturnType<typeof buildTestApi>;
let port: number;

beforeEach(async () => {
  env = await makeContext();
  app = buildTestApi(env, { authToken: "a-token-of-at-least-16-chars" });
  await app.listen({ host: "127.0.0.1", port: 0 });
  port = (app.server.address() as { port: number }).port;
});
afterEach(async () => {
  await app.close();
  await env.dispose();
});

/** Sends raw bytes and returns everything the server answered before it closed. */
function raw(request: string | Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    let answer = "";
    socket.on("data", (chunk) => (answer += chunk.toString("latin1")));
    socket.on("error", reject);
    socket.on("close", () => resolve(answer));
    socket.setTimeout(5_000, () => socket.destroy());
    socket.end(request);
  });
}

function parse(answer: string): { status: number; contentType: string; body: string } {
  const [head = "", body = ""] = answer.split("\r\n\r\n");
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]);
  const contentType = /\r\ncontent-type: ([^\r]+)/i.exec(head)?.[1] ?? "";
  return { status, contentType, body };
}

function expectPlainOneLine(answer: string, status: number): void {
  const parsed = parse(answer);
  expect(parsed.status).toBe(status);
  expect(parsed.contentType).toMatch(/^text\/plain/);
  expect(parsed.body.endsWith("\n")).toBe(true);
  expect(parsed.body.trimEnd()).not.toContain("\n");
  expect(parsed.body).not.toMatch(/^\s*\{/);
}

describe("HTTP edge errors are plain text, one line", () => {
  it("400 for a malformed request line, 431 for oversized headers, 414 for a too long id", async () => {
    expectPlainOneLine(await raw("THIS IS NOT HTTP\r\n\r\n"), 400);
    expectPlainOneLine(
      await raw(`GET /api/healthcheck HTTP/1.1\r\nHost: x\r\nX-Big: ${"a".repeat(20_000)}\r\n\r\n`),
      431,
    );
    const longId = "a".repeat(300);
    expectPlainOneLine(
      await raw(
        `GET /api/tasks/${longId} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a-token-of-at-least-16-chars\r\nConnection: close\r\n\r\n`,
      ),
      414,
    );
  });

  it("413, 415, 401 and 404 through the framework are plain text", async () => {
    const auth = { authorization: "Bearer a-token-of-at-least-16-chars" };
    const big = await app.inject({
      method: "POST",
      url: "/api/tasks",
      headers: { ...auth, "content-type": "application/json" },
      payload: "x".repeat(1024 * 1024 + 10),
    });
    expect([big.statusCode, big.headers["content-type"]]).toEqual([413, "text/plain; charset=utf-8"]);
    const xml = await app.inject({
      method: "POST",
      url: "/api/tasks",
      headers: { ...auth, "content-type": "application/xml" },
      payload: "<a/>",
    });
    expect([xml.statusCode, xml.headers["content-type"]]).toEqual([415, "text/plain; charset=utf-8"]);
    const none = await app.inject({ method: "GET", url: "/api/tasks" });
    expect([none.statusCode, none.headers["content-type"]]).toEqual([401, "text/plain; charset=utf-8"]);
  });

  it("answers 400 for env names that are not environment names (__proto__, A=B, empty)", async () => {
    for (const key of ["__proto__", "A=B", ""]) {
      const answer = await app.inject({
        method: "POST",
        url: "/api/tasks",
        headers: { authorization: "Bearer a-token-of-at-least-16-chars", "content-type": "application/json" },
        payload: `{"id":"env-1","name":"env","image_name":"busybox","env":{${JSON.stringify(key)}:"x"}}`,
      });
      expect([answer.statusCode, answer.body]).toEqual([400, `invalid env name: ${JSON.stringify(key)}\n`]);
    }
    expect(env.ctx.store.list()).toEqual([]);
  });

  it("accepts the bearer scheme in any case", async () => {
    for (const scheme of ["Bearer", "bearer", "BEARER"]) {
      const answer = await app.inject({
        method: "GET",
        url: "/api/tasks",
        headers: { authorization: `${scheme} a-token-of-at-least-16-chars` },
      });
      expect(answer.statusCode).toBe(200);
    }
  });

  it("strips errno codes and everything after the first line", () => {
    expect(
      oneLineMessage("internal error: remove: connect ENOENT /var/run/docker.sock\n    at foo (x.js:1:1)"),
    ).toBe("internal error: remove: connect /var/run/docker.sock");
    expect(oneLineMessage("failed: ERR_STREAM_PREMATURE_CLOSE happened")).toBe("failed: happened");
    expect(oneLineMessage("task EXAMPLE-1 not found")).toBe("task EXAMPLE-1 not found");
  });
});
