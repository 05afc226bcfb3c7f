import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { DockerUnavailableError } from "./docker-errors.js";
import { DockerodeClient } from "./dockerode-client.js";
import { createUnderDeadline } from "./late-create.js";
import { DeadlineExceededError } from "../exec/deadline-signal.js";
import { plainContainerSpec } from "../testing/container-specs.js";
import { rejected } from "../testing/thrown.js";

/** A fake engine whose create answers after `createDelayMs`, and which records every request. */
class SlowEngine {
  readonly seen: string[] = [];
  readonly containers = new Set<string>();
  /** Creates whose client hung up before the answer (the engine created the container anyway). */
  hungUp = 0;
  private server: Server | undefined;
  private next = 0;

  constructor(private readonly createDelayMs: number) {}

  async start(): Promise<number> {
    this.server = createServer((req, res) => void this.answer(req, res));
    await new Promise<void>((resolve) => this.server?.listen(0, "127.0.0.1", resolve));
    return (this.server?.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()));
  }

  private async answer(req: IncomingMessage, res: import("node:http").ServerResponse): Promise<void> {
    const path = (req.url ?? "").replace(/^\/v[\d.]+/, "");
    this.seen.push(`${req.method} ${path.split("?")[0]}`);
    for await (const _ of req) void _;
    if (req.method === "POST" && path.startsWith("/containers/create")) {
      // Like the engine: the container exists once the request is in, answered or not.
      const id = `c${++this.next}`;
      this.containers.add(id);
      res.on("close", () => {
        if (!res.writableFinished) this.hungUp++;
      });
      await sleep(this.createDelayMs);
      if (res.destroyed) return;
      res.writeHead(201, { "content-type": "application/json" });
      res.end(JSON.stringify({ Id: id, Warnings: [] }));
      return;
    }
    const removal = /^\/containers\/([^/?]+)(\?|$)/.exec(path);
    if (req.method === "DELETE" && removal?.[1] !== undefined) {
      const existed = this.containers.delete(removal[1]);
      res.writeHead(existed ? 204 : 404, { "content-type": "application/json" });
      res.end(existed ? "" : JSON.stringify({ message: `No such container: ${removal[1]}` }));
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ message: "not found" }));
  }
}

const spec = plainContainerSpec({ name: "taskshim-late" });

describe("DockerodeClient.createContainer past its deadline", () => {
  let engine: SlowEngine;
  afterEach(async () => {
    await engine.stop();
  });

  it("fails at its deadline, then removes the container its late answer names: no orphan", async () => {
    engine = new SlowEngine(400);
    const port = await engine.start();
    const client = new DockerodeClient({ host: "127.0.0.1", port, protocol: "http" }, undefined, 2_000, 100);
    const started = performance.now();
    const error = await rejected(client.createContainer(spec));
    expect(performance.now() - started).toBeLessThan(350);
    expect(error).toBeInstanceOf(DockerUnavailableError);
    expect(error.message).toMatch(/^create: .*deadline of 100 ms exceeded/);
    expect(engine.containers.size).toBe(1);
    await client.lateCreatesSettled();
    expect(engine.hungUp).toBe(0);
    expect(engine.seen).toEqual(["POST /containers/create", "DELETE /containers/c1"]);
    expect(engine.containers.size).toBe(0);
  });

  it("removes nothing when the answer is in time", async () => {
    engine = new SlowEngine(10);
    const port = await engine.start();
    const client = new DockerodeClient(
      { host: "127.0.0.1", port, protocol: "http" },
      undefined,
      2_000,
      1_000,
    );
    expect(await client.createContainer(spec)).toBe("c1");
    await client.lateCreatesSettled();
    expect(engine.seen).toEqual(["POST /containers/create"]);
    expect(engine.containers.has("c1")).toBe(true);
  });
});

describe("createUnderDeadline", () => {
  it("hands a late answer to onLate, and an answer in time to the caller alone", async () => {
    const late: string[] = [];
    const slow = createUnderDeadline(() => sleep(60).then(() => "made"), {
      timeoutMs: 10,
      lateBoundMs: 1_000,
      onLate: (value) => {
        late.push(value);
        return Promise.resolve();
      },
    });
    expect(await rejected(slow.answer)).toBeInstanceOf(DeadlineExceededError);
    await slow.settled;
    expect(late).toEqual(["made"]);

    const quick = createUnderDeadline(() => Promise.resolve("quick"), {
      timeoutMs: 1_000,
      lateBoundMs: 1_000,
      onLate: (value) => {
        late.push(value);
        return Promise.resolve();
      },
    });
    expect(await quick.answer).toBe("quick");
    await quick.settled;
    expect(late).toEqual(["made"]);
  });

  it("aborts the request with its parent, and at the late bound; a failed late request is nothing to undo", async () => {
    let undone = 0;
    const onLate = (): Promise<void> => {
      undone++;
      return Promise.resolve();
    };
    const untilAborted = (signal: AbortSignal): Promise<string> =>
      new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason as Error)));

    const parent = new AbortController();
    const cut = createUnderDeadline(untilAborted, {
      timeoutMs: 1_000,
      lateBoundMs: 5_000,
      parent: parent.signal,
      onLate,
    });
    parent.abort(new Error("shutting down"));
    expect((await rejected(cut.answer)).message).toBe("shutting down");
    await cut.settled;

    const bounded = createUnderDeadline(untilAborted, { timeoutMs: 10, lateBoundMs: 50, onLate });
    expect(await rejected(bounded.answer)).toBeInstanceOf(DeadlineExceededError);
    await bounded.settled;
    expect(undone).toBe(0);
  });
});
