import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { REMOVAL_TIMEOUT_MS } from "./confirmed-removal.js";
import { DockerodeClient } from "./dockerode-client.js";
import { RemovalUnconfirmedError } from "./docker-errors.js";

/**
 * The confirmed removal on the Engine API path, against a scripted engine over real HTTP: the
 * answers a real engine gives only in races (409 "already in progress") are played on demand.
 */

type Reply = { readonly status: number; readonly body?: unknown } | "hang";

interface FakeEngine {
  readonly client: DockerodeClient;
  /** "DELETE" or "INSPECT", per request: which branch of the removal ran. */
  readonly requests: string[];
  close(): Promise<void>;
}

let engine: FakeEngine | undefined;
afterEach(async () => {
  await engine?.close();
  engine = undefined;
});

async function fakeEngine(
  removes: Reply[],
  inspects: Reply[],
  removalTimeoutMs?: number,
): Promise<FakeEngine> {
  const requests: string[] = [];
  const hanging: ServerResponse[] = [];
  const answer = (res: ServerResponse, replies: Reply[]): void => {
    const reply = replies.length > 1 ? replies.shift() : replies[0];
    if (reply === undefined || reply === "hang") {
      hanging.push(res);
      return;
    }
    res.writeHead(reply.status, { "content-type": "application/json" });
    res.end(reply.body === undefined ? "" : JSON.stringify(reply.body));
  };
  const server: Server = createServer((req: IncomingMessage, res) => {
    if (req.method === "DELETE" && /\/containers\/c1\?/.test(req.url ?? "")) {
      requests.push("DELETE");
      answer(res, removes);
    } else if (req.method === "GET" && /\/containers\/c1\/json/.test(req.url ?? "")) {
      requests.push("INSPECT");
      answer(res, inspects);
    } else {
      res.writeHead(500).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    client: new DockerodeClient({ host: "127.0.0.1", port, protocol: "http" }, undefined, removalTimeoutMs),
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        for (const res of hanging) res.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const inspectBody = {
  Id: "c1",
  Name: "/c1",
  Config: { Labels: {} },
  State: { Status: "removing", ExitCode: 0, OOMKilled: false, Error: "", StartedAt: "", FinishedAt: "" },
  RestartCount: 0,
  NetworkSettings: { Ports: {} },
  HostConfig: {},
};
const IN_PROGRESS = { status: 409, body: { message: "removal of container c1 is already in progress" } };
const NO_SUCH = { status: 404, body: { message: "No such container: c1" } };

async function reasonOf(promise: Promise<unknown>): Promise<RemovalUnconfirmedError["reason"]> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(RemovalUnconfirmedError);
  return (error as RemovalUnconfirmedError).reason;
}

describe("the seed's removal constant", () => {
  it("removal deadline 30 s", () => {
    expect(REMOVAL_TIMEOUT_MS).toBe(30_000);
  });
});

describe("DockerodeClient.removeContainer: the seed's confirmed removal on the Engine API", () => {
  it("a 204 is removed, with no inspect", async () => {
    engine = await fakeEngine([{ status: 204 }], []);
    expect(await engine.client.removeContainer("c1")).toBe("removed");
    expect(engine.requests).toEqual(["DELETE"]);
  });

  it("'No such container' is already absent, with no inspect", async () => {
    engine = await fakeEngine([NO_SUCH], []);
    expect(await engine.client.removeContainer("c1")).toBe("already-absent");
    expect(engine.requests).toEqual(["DELETE"]);
  });

  it("'already in progress' polls inspect until it is gone: already absent", async () => {
    engine = await fakeEngine(
      [IN_PROGRESS],
      [{ status: 200, body: inspectBody }, { status: 500, body: { message: "boom" } }, NO_SUCH],
    );
    const started = Date.now();
    expect(await engine.client.removeContainer("c1")).toBe("already-absent");
    // A 500 between two probes keeps the poll going; 250 ms between probes.
    expect(engine.requests).toEqual(["DELETE", "INSPECT", "INSPECT", "INSPECT"]);
    expect(Date.now() - started).toBeGreaterThanOrEqual(2 * 250 - 20);
  });

  it("'already in progress' that never ends is unconfirmed at the deadline", async () => {
    engine = await fakeEngine([IN_PROGRESS], [{ status: 200, body: inspectBody }], 800);
    const started = Date.now();
    const reason = await reasonOf(engine.client.removeContainer("c1"));
    expect(reason).toMatchObject({ kind: "deadline", cleanup: null });
    expect(Date.now() - started).toBeGreaterThanOrEqual(790);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(engine.requests.filter((r) => r === "INSPECT").length).toBeGreaterThanOrEqual(3);
  });

  it("an inspect that hangs cannot outlive the deadline", async () => {
    engine = await fakeEngine([IN_PROGRESS], ["hang"], 600);
    const started = Date.now();
    expect((await reasonOf(engine.client.removeContainer("c1"))).kind).toBe("deadline");
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("a removal that hangs is unconfirmed at the deadline", async () => {
    engine = await fakeEngine(["hang"], [], 500);
    const started = Date.now();
    expect(await reasonOf(engine.client.removeContainer("c1"))).toMatchObject({
      kind: "deadline",
      cleanup: null,
    });
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("any other engine error is typed as engine, with no inspect", async () => {
    engine = await fakeEngine([{ status: 500, body: { message: "driver failed" } }], []);
    expect(await reasonOf(engine.client.removeContainer("c1"))).toEqual({
      kind: "engine",
      detail: "remove: driver failed",
    });
    expect(engine.requests).toEqual(["DELETE"]);
  });
});
