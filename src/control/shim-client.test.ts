import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TASK_STATUSES } from "../tasks/task-status.js";
import {
  negotiateFeatures,
  parseShimVersion,
  ShimClient,
  ShimHttpError,
  ShimProtocolError,
  ShimUnreachableError,
} from "./shim-client.js";
import { formatUpgradeTable } from "./upgrade.js";

describe("parseShimVersion (dstack's _parse_version)", () => {
  it("keeps a final X.Y.Z and treats anything else as the newest build", () => {
    expect(parseShimVersion("0.19.26")).toBe("0.19.26");
    expect(parseShimVersion("1.0.0")).toBe("1.0.0");
    for (const v of ["latest", "0.0.1.dev2", "1.2.0-rc.1", "1", ""]) expect(parseShimVersion(v)).toBeNull();
  });
});

describe("negotiateFeatures", () => {
  it("gates features on the version like dstack's client", () => {
    const old = negotiateFeatures({ service: "dstack-shim", version: "0.18.30" });
    expect(old).toMatchObject({ apiVersion: 1, components: false, shutdown: false, instanceHealth: false });
    const mid = negotiateFeatures({ service: "dstack-shim", version: "0.20.0" });
    expect(mid).toMatchObject({ apiVersion: 2, components: true, shutdown: false, instanceInfo: false });
    const dev = negotiateFeatures({ service: "dstack-shim", version: "latest" });
    expect(dev).toMatchObject({
      apiVersion: 2,
      components: true,
      shutdown: true,
      instanceInfo: true,
      version: null,
    });
  });

  it("passes every gate for taskshim 1.0.0, whose every status survives a restart", () => {
    const features = negotiateFeatures({
      service: "dstack-shim",
      version: "1.0.0",
      implementation: "taskshim",
    });
    expect(features).toMatchObject({
      apiVersion: 2,
      instanceHealth: true,
      instanceInfo: true,
      components: true,
      shutdown: true,
    });
    expect(features.restartSafeStatuses).toEqual(TASK_STATUSES);
  });

  it("gates restarts on the version alone, as dstack reads it", () => {
    const every = TASK_STATUSES;
    const table: [string, string | undefined, readonly string[]][] = [
      // dstack-shim before #4224: only terminated tasks survive a restart.
      ["0.18.30", undefined, ["terminated"]],
      ["0.21.2", undefined, ["terminated"]],
      // dstack #4224: running tasks survive a restart of shim >= 0.21.3.
      ["0.21.3", undefined, ["terminated", "running"]],
      ["0.22.0", undefined, ["terminated", "running"]],
      ["0.99.99", undefined, ["terminated", "running"]],
      // taskshim >= 1.0.0: every status survives (durable task.json), with or without the field.
      ["1.0.0", "taskshim", every],
      ["1.0.0", undefined, every],
      ["1.4.2", "taskshim", every],
      // Non-final versions are the newest build: the newest rules.
      ["latest", undefined, every],
      ["1.2.0-rc.1", undefined, every],
      ["0.21.3-rc.1", undefined, every],
      ["0.0.1.dev2", undefined, every],
      // The non-standard field changes nothing: an old version stays old.
      ["0.9.0", "taskshim", ["terminated"]],
      ["0.21.3", "taskshim", ["terminated", "running"]],
    ];
    for (const [version, implementation, expected] of table) {
      const health = { service: "dstack-shim", version, ...(implementation ? { implementation } : {}) };
      expect([version, negotiateFeatures(health).restartSafeStatuses]).toEqual([version, expected]);
    }
  });
});

describe("formatUpgradeTable", () => {
  it("prints one aligned row per shim, with what was compared and each build id it knows", () => {
    const table = formatUpgradeTable([
      {
        shim: "http://a",
        outcome: "upgraded",
        compared: "build_id",
        from: "1.0.0",
        fromBuildId: null,
        to: "1.0.0",
        toBuildId: "9f86d081884c7d659a2f",
        windowMs: 812,
        tasksBefore: 3,
        tasksKept: 3,
      },
      {
        shim: "http://bb",
        outcome: "failed",
        compared: null,
        from: "1.0.0",
        fromBuildId: "0123456789abcdef0123",
        to: "",
        toBuildId: null,
        windowMs: null,
        tasksBefore: 1,
        tasksKept: null,
        error: "x",
      },
    ]);
    const lines = table.split("\n");
    expect(lines[0]).toMatch(/^shim\s+outcome\s+compared\s+from\s+to\s+window ms\s+tasks kept\s+error$/);
    expect(lines[1]).toMatch(
      /^http:\/\/a\s+upgraded\s+build_id\s+1\.0\.0\s+1\.0\.0\+9f86d081884c7d659a2f\s+812\s+3\/3$/,
    );
    // A failed upgrade that never counted the tasks does not claim it kept none of them.
    expect(lines[2]).toMatch(/failed +- +1\.0\.0\+0123456789abcdef0123 +- +- +not checked +x$/);
  });
});

describe("ShimClient over HTTP", () => {
  let server: Server;
  let url: string;
  const seen: IncomingMessage[] = [];

  beforeAll(async () => {
    server = createServer((request, response) => {
      seen.push(request);
      const send = (status: number, type: string, body: string): void => {
        response.writeHead(status, { "content-type": type }).end(body);
      };
      switch (request.url) {
        case "/api/healthcheck":
          return send(
            200,
            "application/json",
            '{"service":"dstack-shim","version":"1.0.0","implementation":"taskshim","build":{"commit":"abc","dirty":false,"build_id":"9f86d081884c7d659a2f"}}',
          );
        case "/api/components":
          return send(
            200,
            "application/json",
            '{"components":[{"name":"dstack-runner","version":"0.19.26","status":"installed"},' +
              '{"name":"dstack-shim","version":"1.0.0","status":"installed","build_id":"0123456789abcdef0123"}]}',
          );
        case "/api/tasks/t%2F1/logs?tail=2":
          return send(200, "text/plain; charset=utf-8", "line 1\nline 2\n");
        case "/api/instance/info":
          return send(200, "application/json", '{"gpu_vendor":"nvidia","gpu_driver_version":"570.86.15"}');
        case "/metrics":
          return send(200, "text/plain; version=0.0.4", "taskshim_engine_up 1\n");
        case "/api/tasks":
          return send(409, "text/plain; charset=utf-8", "request error: task dup is already submitted\n");
        case "/api/tasks/dup":
          return send(
            200,
            "application/json",
            '{"id":"dup","status":"running","termination_reason":"","termination_message":""}',
          );
        case "/api/tasks/slow/terminate":
          // A container that ignores SIGTERM: the answer comes after the grace period.
          setTimeout(
            () =>
              send(
                200,
                "application/json",
                '{"id":"slow","status":"terminated","termination_reason":"terminated_by_user","termination_message":""}',
              ),
            600,
          );
          return;
        case "/api/tasks/bad":
          return send(200, "application/json", '{"id":"bad","status":"sleeping"}');
        case undefined:
        default:
          return send(404, "text/plain; charset=utf-8", "404 page not found\n");
      }
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it("reads the healthcheck's build and a component's build_id, both taskshim extensions", async () => {
    const client = new ShimClient(url);
    expect((await client.healthcheck()).build).toEqual({
      commit: "abc",
      dirty: false,
      build_id: "9f86d081884c7d659a2f",
    });
    const [runner, shim] = await client.getComponents();
    expect(runner?.build_id).toBeUndefined();
    expect(shim?.build_id).toBe("0123456789abcdef0123");
  });

  it("reads the logs extension as text, with the id encoded", async () => {
    expect(await new ShimClient(url).logs("t/1", 2)).toBe("line 1\nline 2\n");
  });

  it("reads instance info and metrics", async () => {
    const client = new ShimClient(url);
    expect(await client.instanceInfo()).toEqual({ gpu_vendor: "nvidia", gpu_driver_version: "570.86.15" });
    expect(await client.metrics()).toBe("taskshim_engine_up 1\n");
  });

  it("sends the bearer token when it has one, and none otherwise", async () => {
    seen.length = 0;
    await new ShimClient(url, 9_000, { authToken: "s3cret-token-0123456789" }).metrics();
    await new ShimClient(url).metrics();
    expect(seen.map((r) => r.headers.authorization)).toEqual(["Bearer s3cret-token-0123456789", undefined]);
  });

  it("names method, path, status and body in an HTTP error", async () => {
    const error = await new ShimClient(url).removeTask("nope").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ShimHttpError);
    expect((error as ShimHttpError).message).toBe(
      "POST /api/tasks/nope/remove: HTTP 404: 404 page not found",
    );
    expect((error as ShimHttpError).method).toBe("POST");
  });

  it("adopts an existing task on a 409 submit unless told not to", async () => {
    const client = new ShimClient(url);
    expect(await client.submitTask({ id: "dup" })).toMatchObject({ id: "dup", status: "running" });
    await expect(client.submitTask({ id: "dup" }, { adoptExisting: false })).rejects.toThrow(
      "POST /api/tasks: HTTP 409: request error: task dup is already submitted",
    );
  });

  it("waits for a terminate the whole grace period plus its usual deadline", async () => {
    // A 300 ms deadline alone would give up on the 600 ms answer; 1 s of grace covers it.
    const client = new ShimClient(url, 300);
    await expect(client.terminateTask("slow", "terminated_by_user", "", 1)).resolves.toMatchObject({
      status: "terminated",
    });
    await expect(client.terminateTask("slow", "terminated_by_user", "", 0)).rejects.toThrow(
      ShimUnreachableError,
    );
  });

  it("refuses an answer outside the contract", async () => {
    await expect(new ShimClient(url).getTask("bad")).rejects.toThrow(ShimProtocolError);
  });

  it("says why a shim is unreachable, not just that fetch failed", async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const error = await new ShimClient(`http://127.0.0.1:${port}`).listTasks().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ShimUnreachableError);
    expect((error as Error).message).toMatch(/ECONNREFUSED/);
  });
});
