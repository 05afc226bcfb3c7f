import { join } from "node:path";
import { rm } from "node:fs/promises";
import { readFileSync } from "node:fs";
import type { InjectOptions, LightMyRequestResponse } from "fastify";
import { VERSION } from "../version.js";
import { FakeCommandRunner } from "../testing/fake-command-runner.js";
import { taskBody } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { buildTestApi } from "../testing/test-api.js";
import { ShimMetrics } from "./metrics.js";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { armFailpoints } from "../runner/failpoints.js";
import type { buildApi } from "./server.js";
import type { Static } from "typebox";
import type { Healthcheck as HealthcheckSchema } from "../wire/schemas.js";
import type { EngineInfo } from "../docker/engine-info.js";
import { SHIM_PHASES, ShimLifecycle } from "../lifecycle/shim-lifecycle.js";

type Healthcheck = Static<typeof HealthcheckSchema>;

const PACKAGE_VERSION = (
  JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }
).version;

const TASK_INFO_KEYS = [
  "id",
  "status",
  "termination_reason",
  "termination_message",
  "ports",
  "image_pull_progress",
  "container_name",
  "container_id",
  "gpus_ids",
  // taskshim extensions, ignored by dstack's server.
  "name",
  "image_name",
  "exit_code",
  "created_at",
  "started_at",
  "finished_at",
];

let env: TestEnv;
let app: ReturnType<typeof buildApi>;
let requestShutdown: ReturnType<typeof vi.fn<(force: boolean) => void>>;
let componentCommands: FakeCommandRunner;

beforeEach(async () => {
  env = await makeContext();
  componentCommands = new FakeCommandRunner();
  requestShutdown = vi.fn<(force: boolean) => void>();
  app = buildTestApi(env, { commands: componentCommands, requestShutdown });
  await app.ready();
});
afterEach(async () => {
  armFailpoints(undefined);
  await app.close();
  await env.dispose();
});

const post = (url: string, payload?: string | object, headers: Record<string, string> = {}) => {
  const options: InjectOptions = { method: "POST", url, headers };
  if (payload !== undefined) {
    options.payload = typeof payload === "string" ? payload : JSON.stringify(payload);
    if (headers["content-type"] === undefined)
      options.headers = { "content-type": "application/json", ...headers };
  }
  return app.inject(options);
};

/** The exact plain-text error dstack-shim's `http.Error` writes. */
function expectTextError(res: LightMyRequestResponse, status: number, body?: string | RegExp): void {
  expect(res.statusCode).toBe(status);
  expect(res.headers["content-type"]).toBe("text/plain; charset=utf-8");
  expect(res.headers["x-content-type-options"]).toBe("nosniff");
  expect(res.body.endsWith("\n")).toBe(true);
  if (typeof body === "string") expect(res.body).toBe(body);
  else if (body) expect(res.body).toMatch(body);
}

async function submitRunning(overrides: Record<string, unknown> = {}): Promise<string> {
  const body = taskBody(overrides);
  const res = await post("/api/tasks", body);
  expect(res.statusCode).toBe(200);
  await env.runner.awaitStarts();
  return body.id as string;
}

describe("GET endpoints", () => {
  it("healthcheck answers service and version first, and the engine's health as an extension", async () => {
    const res = await app.inject({ method: "GET", url: "/api/healthcheck" });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^application\/json/);
    expect(res.body).toMatch(
      new RegExp(`^\\{"service":"dstack-shim","version":"${PACKAGE_VERSION.replaceAll(".", "\\.")}",`),
    );
    expect(res.json()).toEqual({
      service: "dstack-shim",
      version: PACKAGE_VERSION,
      implementation: "taskshim",
      engine: { status: "unknown" },
      storage: { status: "ok", since: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) as unknown },
      // Unbundled (vitest): src/version.ts's defaults.
      build: { commit: "unknown", dirty: false, build_id: "dev" },
    });
  });

  it("names the engine in the healthcheck once it is known, beside dstack's fields unchanged", async () => {
    let engine: EngineInfo | undefined;
    const metrics = new ShimMetrics(env.ctx.store, VERSION);
    const named = buildTestApi(env, { engineInfo: () => engine, metrics });
    try {
      const before = (await named.inject({ method: "GET", url: "/api/healthcheck" })).json<Healthcheck>();
      expect(before.engine).toEqual({ status: "unknown" });
      expect(await metrics.exposition()).not.toMatch(/^taskshim_engine_info\{/m);
      engine = { kind: "podman", version: "4.3.1", apiVersion: "1.41" };
      metrics.setEngine(engine);
      await env.reconciler.tick();
      const res = await named.inject({ method: "GET", url: "/api/healthcheck" });
      expect(res.body).toMatch(/^\{"service":"dstack-shim","version":"/);
      expect(res.json<Healthcheck>().engine).toEqual({
        status: "up",
        since: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) as unknown,
        kind: "podman",
        version: "4.3.1",
      });
      // A swapped engine replaces the series: one engine, one line.
      metrics.setEngine({ kind: "docker", version: "20.10.24+dfsg1" });
      const lines = (await metrics.exposition())
        .split("\n")
        .filter((l) => l.startsWith("taskshim_engine_info"));
      expect(lines).toEqual(['taskshim_engine_info{engine="docker",version="20.10.24+dfsg1"} 1']);
    } finally {
      await named.close();
    }
  });

  it("shows the shim's lifecycle phase in the healthcheck and as taskshim_phase, one phase at 1", async () => {
    const lifecycle = new ShimLifecycle({ info: () => undefined, error: () => undefined }, () => 0);
    const metrics = new ShimMetrics(env.ctx.store, VERSION);
    metrics.setPhase(lifecycle.phase);
    lifecycle.onChange((view) => metrics.setPhase(view.phase));
    const api = buildTestApi(env, { lifecycle: () => lifecycle.view, metrics });
    try {
      lifecycle.to("restoring");
      lifecycle.to("serving");
      const res = await api.inject({ method: "GET", url: "/api/healthcheck" });
      expect(res.json<Healthcheck>().lifecycle).toEqual({
        phase: "serving",
        since: new Date(0).toISOString(),
      });
      lifecycle.to("draining");
      expect(
        (await api.inject({ method: "GET", url: "/api/healthcheck" })).json<Healthcheck>().lifecycle?.phase,
      ).toBe("draining");
      const phases = (await metrics.exposition()).split("\n").filter((l) => l.startsWith("taskshim_phase{"));
      expect(phases).toEqual(
        SHIM_PHASES.map((p) => `taskshim_phase{phase="${p}"} ${p === "draining" ? 1 : 0}`),
      );
    } finally {
      await api.close();
    }
  });

  it("serves Prometheus metrics with tasks by status and no task ids in labels", async () => {
    const id = await submitRunning();
    const res = await app.inject({ method: "GET", url: "/metrics" });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^text\/plain/);
    expect(res.body).toContain('taskshim_tasks{status="running"} 1');
    expect(res.body).toContain('taskshim_tasks{status="pending"} 0');
    expect(res.body).not.toContain(id);
  });

  it("serves build info, the process start time as the restart signal, and no blank line", async () => {
    const res = await app.inject({ method: "GET", url: "/metrics" });
    expect(res.body).toContain(
      `taskshim_build_info{version="${VERSION}",node="${process.version}",commit="unknown",dirty="false",build_id="dev"} 1`,
    );
    const start = Number(/^process_start_time_seconds (\d+)$/m.exec(res.body)?.[1]);
    expect(Math.abs(start - (Date.now() / 1000 - process.uptime()))).toBeLessThan(2);
    expect(res.body).not.toContain("taskshim_process_starts_total");
    expect(res.body).not.toMatch(/\n\n/);
    expect(res.body).toContain("# TYPE taskshim_engine_call_duration_seconds histogram");
  });

  it("labels build info with the build identity it is given", async () => {
    const metrics = new ShimMetrics(undefined, "1.2.3", {
      commit: "0123456789abcdef0123456789abcdef01234567",
      dirty: true,
      buildId: "9f86d081884c7d659a2f",
    });
    expect(await metrics.exposition()).toContain(
      `taskshim_build_info{version="1.2.3",node="${process.version}",commit="0123456789abcdef0123456789abcdef01234567",dirty="true",build_id="9f86d081884c7d659a2f"} 1`,
    );
  });

  it("observes Engine API call latency by operation", () => {
    const metrics = new ShimMetrics(undefined, VERSION);
    metrics.countEngineCall("container-list", "ok", 0.004);
    metrics.countEngineCall("container-list", "error", 0.2);
    return metrics.exposition().then((text) => {
      expect(text).toContain('taskshim_engine_call_duration_seconds_count{op="container-list"} 2');
      expect(text).toContain(
        'taskshim_engine_call_duration_seconds_bucket{le="0.005",op="container-list"} 1',
      );
      expect(text).toContain('taskshim_engine_calls_total{op="container-list",result="error"} 1');
    });
  });

  it("lists tasks as {tasks: [{id, status}]}", async () => {
    expect((await app.inject({ method: "GET", url: "/api/tasks" })).json()).toEqual({ tasks: [] });
    const id = await submitRunning();
    const res = await app.inject({ method: "GET", url: "/api/tasks" });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ tasks: [{ id, status: "running" }] });
  });

  it("answers reads serialized once per change, never a stale one", async () => {
    const id = await submitRunning();
    const get = async (url: string) => {
      const res = await app.inject({ method: "GET", url });
      expect(res.headers["content-type"]).toBe("application/json; charset=utf-8");
      return res.json<Record<string, unknown>>();
    };
    expect(await get("/api/tasks")).toEqual({ tasks: [{ id, status: "running" }] });
    expect(await get(`/api/tasks/${id}`)).toMatchObject({ status: "running", termination_reason: "" });
    env.ctx.store.modify(id, (d) => {
      d.status = "terminated";
      d.terminationReason = "done_by_runner";
    });
    expect(await get("/api/tasks")).toEqual({ tasks: [{ id, status: "terminated" }] });
    expect(await get(`/api/tasks/${id}`)).toMatchObject({
      status: "terminated",
      termination_reason: "done_by_runner",
    });
    env.ctx.store.delete(id);
    expect(await get("/api/tasks")).toEqual({ tasks: [] });
  });

  it("task info has exactly the TaskInfoResponse keys", async () => {
    const id = await submitRunning({ gpu: 1 });
    const res = await app.inject({ method: "GET", url: `/api/tasks/${id}` });
    expect(res.statusCode).toBe(200);
    const info = res.json<Record<string, unknown>>();
    expect(Object.keys(info).sort()).toEqual([...TASK_INFO_KEYS].sort());
    const task = env.ctx.store.mustGet(id);
    expect(info).toMatchObject({
      id,
      status: "running",
      termination_reason: "",
      termination_message: "",
      ports: [],
      container_name: task.containerName,
      container_id: task.containerId,
      gpus_ids: ["/dev/dri/renderD128"],
    });
  });

  it("answers 404 'Not Found' in plain text for an unknown task", async () => {
    expectTextError(await app.inject({ method: "GET", url: "/api/tasks/nope" }), 404, "Not Found\n");
  });

  it("answers 404 page not found for an unknown path", async () => {
    expectTextError(
      await app.inject({ method: "GET", url: "/api/nothing-here" }),
      404,
      "404 page not found\n",
    );
    expectTextError(await app.inject({ method: "POST", url: "/nothing" }), 404, "404 page not found\n");
  });

  it("answers 405 for a wrong method on a known path", async () => {
    expectTextError(await app.inject({ method: "DELETE", url: "/api/tasks" }), 405, "Method Not Allowed\n");
    expectTextError(await app.inject({ method: "GET", url: "/api/shutdown" }), 405, "Method Not Allowed\n");
    expectTextError(await app.inject({ method: "PUT", url: "/api/tasks/abc/terminate" }), 405);
    expectTextError(await app.inject({ method: "POST", url: "/api/healthcheck" }), 405);
  });

  it("answers reads from memory: a task GET makes no Docker call", async () => {
    const id = await submitRunning();
    env.docker.resetCalls();
    for (const url of [`/api/tasks/${id}`, "/api/tasks", "/api/healthcheck", "/api/instance/info"]) {
      expect((await app.inject({ method: "GET", url })).statusCode).toBe(200);
    }
    expect(env.docker.calls.map((c) => c.method)).toEqual([]);
  });

  it("instance info comes from the first GPU", async () => {
    const res = await app.inject({ method: "GET", url: "/api/instance/info" });
    expect(res.json()).toEqual({ gpu_vendor: "amd", gpu_driver_version: "6.8.5" });
  });
});

describe("GET /api/tasks/:id/logs", () => {
  const logs = (taskId: string, query = "") =>
    app.inject({ method: "GET", url: `/api/tasks/${taskId}/logs${query}` });

  it("answers the last `tail` lines as text, one per line with a trailing newline", async () => {
    const taskId = await submitRunning();
    const { containerId } = env.ctx.store.mustGet(taskId);
    env.docker.mustFind(containerId!).logs.push("one", "two", "three");
    const res = await logs(taskId, "?tail=2");
    expect([res.statusCode, res.headers["content-type"], res.body]).toEqual([
      200,
      "text/plain; charset=utf-8",
      "two\nthree\n",
    ]);
  });

  it("rejects a tail outside 1..10000 with 400", async () => {
    const taskId = await submitRunning();
    for (const tail of ["0", "10001", "-1", "1.5", "x"]) {
      expectTextError(await logs(taskId, `?tail=${tail}`), 400, "tail must be an integer from 1 to 10000\n");
    }
  });

  it("answers 410 for a task whose container is gone, 500 when the engine fails", async () => {
    const taskId = await submitRunning();
    const { containerId } = env.ctx.store.mustGet(taskId);
    env.docker.failNext("containerLogTail", new Error("engine timed out"));
    expectTextError(await logs(taskId), 500, "internal error: failed to read logs: engine timed out\n");
    env.docker.remove(containerId!);
    expectTextError(await logs(taskId), 410, `task ${taskId}: its container is gone\n`);
  });
});

describe("request body decoding", () => {
  it("has no fastify schema compiler: a route schema fails the build instead of loading ajv", async () => {
    const other = buildTestApi(env);
    other.post("/schema", { schema: { body: { type: "object" } } }, () => "never");
    await expect(other.ready()).rejects.toThrow(/declare no schema/);
  });

  it("rejects a Content-Type other than application/json with 415", async () => {
    const res = await post("/api/tasks", JSON.stringify(taskBody()), { "content-type": "text/plain" });
    expectTextError(res, 415, "Content-Type header is not application/json\n");
    expect(env.ctx.store.size).toBe(0);
  });

  it("accepts a JSON body without a Content-Type header", async () => {
    const body = taskBody();
    const res = await app.inject({ method: "POST", url: "/api/tasks", payload: JSON.stringify(body) });
    expect(res.headers["content-type"]).toMatch(/^application\/json/);
    expect(res.statusCode).toBe(200);
    expect(res.json<{ id: string }>().id).toBe(body.id);
    await env.runner.awaitStarts();
  });

  it("accepts application/json with parameters", async () => {
    const res = await post("/api/tasks", taskBody(), { "content-type": "application/json; charset=utf-8" });
    expect(res.statusCode).toBe(200);
    await env.runner.awaitStarts();
  });

  it("rejects an empty body with 400", async () => {
    expectTextError(
      await post("/api/tasks", "", { "content-type": "application/json" }),
      400,
      "Request body must not be empty\n",
    );
    expectTextError(
      await app.inject({ method: "POST", url: "/api/tasks" }),
      400,
      "Request body must not be empty\n",
    );
  });

  it("rejects bad JSON with 400", async () => {
    const res = await post("/api/tasks", '{"id": "x",', { "content-type": "application/json" });
    expectTextError(res, 400, /^Request body contains badly-formed JSON/);
  });

  it("rejects a body over 1 MiB with 413", async () => {
    const huge = JSON.stringify({ ...taskBody(), padding: "x".repeat(1024 * 1024) });
    expectTextError(await post("/api/tasks", huge), 413, "Request body must not be larger than 1MB\n");
    expect(env.ctx.store.size).toBe(0);
  });
});

describe("POST /api/tasks", () => {
  it("answers 400 for an empty id, name or image_name", async () => {
    expectTextError(await post("/api/tasks", { name: "a", image_name: "busybox" }), 400, "empty id\n");
    expectTextError(await post("/api/tasks", { id: "t1", image_name: "busybox" }), 400, "empty name\n");
    expectTextError(
      await post("/api/tasks", { id: "t1", name: "a", image_name: "" }),
      400,
      "empty image_name\n",
    );
    expect(env.ctx.store.size).toBe(0);
  });

  it("answers 409 'request error: …' for a duplicate id with a different config, 200 for the same", async () => {
    const body = taskBody();
    expect((await post("/api/tasks", body)).statusCode).toBe(200);
    const same = await post("/api/tasks", body);
    expect(same.statusCode).toBe(200);
    expect(same.json<{ id: string }>().id).toBe(body.id);
    const conflict = await post("/api/tasks", { ...body, image_name: "busybox:1.37" });
    expectTextError(conflict, 409, /^request error: /);
    await env.runner.awaitStarts();
    expect(env.docker.count("createContainer")).toBe(1);
  });

  it("answers 400 with the path and the fix when the runner binary is missing, unless the task has a command", async () => {
    const bare = buildTestApi(env, { withoutRunner: true });
    await rm(join(env.home, "bin", "dstack-runner"), { force: true });
    try {
      const body = taskBody();
      const refused = await bare.inject({ method: "POST", url: "/api/tasks", payload: body });
      expectTextError(
        refused,
        400,
        new RegExp(
          `^the runner binary ${join(env.home, "bin", "dstack-runner")} does not exist: install dstack-runner there .*or give the task a command\n$`,
        ),
      );
      expect(env.ctx.store.size).toBe(0);
      const withCommand = await bare.inject({
        method: "POST",
        url: "/api/tasks",
        payload: { ...taskBody(), command: ["true"] },
      });
      expect(withCommand.statusCode).toBe(200);
      await env.runner.awaitStarts();
    } finally {
      await bare.close();
    }
  });

  it("answers with the snake_case task info", async () => {
    const body = taskBody();
    const res = await post("/api/tasks", body);
    expect(Object.keys(res.json<object>()).sort()).toEqual([...TASK_INFO_KEYS].sort());
    await env.runner.awaitStarts();
  });
});

describe("POST /api/tasks/{id}/terminate", () => {
  it("rejects a negative or fractional timeout with 400", async () => {
    const id = await submitRunning();
    for (const timeout of [-1, 1.5]) {
      const res = await post(`/api/tasks/${id}/terminate`, {
        termination_reason: "terminated_by_user",
        timeout,
      });
      expectTextError(res, 400, /timeout/);
    }
    expect(env.ctx.store.mustGet(id).status).toBe("running");
    expect(env.docker.count("stopContainer")).toBe(0);
  });

  it("answers 404 for an unknown task", async () => {
    const res = await post("/api/tasks/nope/terminate", {
      termination_reason: "terminated_by_user",
      timeout: 0,
    });
    expectTextError(res, 404);
  });

  it("terminates and answers the task info, keeping the first reason on a repeat", async () => {
    const id = await submitRunning();
    const first = await post(`/api/tasks/${id}/terminate`, {
      termination_reason: "terminated_by_user",
      termination_message: "bye",
      timeout: 0,
    });
    expect(first.statusCode).toBe(200);
    expect(first.json()).toMatchObject({
      id,
      status: "terminated",
      termination_reason: "terminated_by_user",
    });
    const again = await post(`/api/tasks/${id}/terminate`, {
      termination_reason: "max_duration_exceeded",
      timeout: 0,
    });
    expect(again.statusCode).toBe(200);
    expect(again.json()).toMatchObject({
      termination_reason: "terminated_by_user",
      termination_message: "bye",
    });
  });

  it("gives a terminate without a reason the valid reason terminated_by_server", async () => {
    const id = await submitRunning();
    const res = await post(`/api/tasks/${id}/terminate`, {
      termination_reason: "",
      termination_message: "",
      timeout: 0,
    });
    expect(res.json()).toMatchObject({ status: "terminated", termination_reason: "terminated_by_server" });
  });

  it("answers 500 'internal error: failed to stop container: …' when the stop fails", async () => {
    const id = await submitRunning();
    env.docker.failNext("stopContainer", new Error("engine went away"));
    const res = await post(`/api/tasks/${id}/terminate`, {
      termination_reason: "terminated_by_user",
      timeout: 0,
    });
    expectTextError(res, 500, /^internal error: failed to stop container: .*engine went away/);
  });
});

describe("POST /api/tasks/{id}/remove", () => {
  it("answers 409 for a running task", async () => {
    const id = await submitRunning();
    const res = await post(`/api/tasks/${id}/remove`);
    expectTextError(res, 409, `request error: cannot remove task ${id} with running status\n`);
  });

  it("answers 404 for an unknown task", async () => {
    expectTextError(await post("/api/tasks/nope/remove"), 404);
  });

  it("answers 200 with a bare newline in text/plain once removed", async () => {
    const id = await submitRunning();
    expect(
      (await post(`/api/tasks/${id}/terminate`, { termination_reason: "terminated_by_user" })).statusCode,
    ).toBe(200);
    const res = await post(`/api/tasks/${id}/remove`);
    expect(res.statusCode).toBe(200);
    expect(res.body).toBe("\n");
    expect(res.headers["content-type"]).toBe("text/plain; charset=utf-8");
    expect(env.ctx.store.get(id)).toBeUndefined();
    expect((await app.inject({ method: "GET", url: `/api/tasks/${id}` })).statusCode).toBe(404);
  });
});

describe("POST /api/shutdown", () => {
  it("answers 200 and asks for a graceful shutdown", async () => {
    const res = await post("/api/shutdown", { force: false });
    expect(res.statusCode).toBe(200);
    expect(res.body).toBe("\n");
    expect(requestShutdown.mock.calls).toEqual([[false]]);
  });

  it("passes force on", async () => {
    await post("/api/shutdown", { force: true });
    expect(requestShutdown.mock.calls).toEqual([[true]]);
  });

  it("rejects an empty body with 400 and does not shut down", async () => {
    expectTextError(await post("/api/shutdown", ""), 400, "Request body must not be empty\n");
    expectTextError(await post("/api/shutdown", { force: "yes" }), 400);
    expect(requestShutdown).not.toHaveBeenCalled();
  });
});

describe("components", () => {
  it("lists dstack-runner, then dstack-shim", async () => {
    const res = await app.inject({ method: "GET", url: "/api/components" });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({
      components: [
        { name: "dstack-runner", version: "", status: "not-installed" },
        { name: "dstack-shim", version: "", status: "not-installed" },
      ],
    });
  });

  it("rejects an install with an empty name, an empty url or an unknown component with 400", async () => {
    expectTextError(
      await post("/api/components/install", { name: "", url: "https://example.com/x" }),
      400,
      "empty name\n",
    );
    expectTextError(
      await post("/api/components/install", { name: "dstack-runner", url: "" }),
      400,
      "empty url\n",
    );
    expectTextError(
      await post("/api/components/install", { name: "dstack-other", url: "https://example.com/x" }),
      400,
      "unknown component\n",
    );
    expect(componentCommands.calls).toEqual([]);
    const list = await app.inject({ method: "GET", url: "/api/components" });
    expect(list.json<{ components: { status: string }[] }>().components.map((c) => c.status)).toEqual([
      "not-installed",
      "not-installed",
    ]);
  });
});

describe("storage faults", () => {
  it("a submit the home cannot take answers 503 in plain text, and the task does not exist", async () => {
    armFailpoints("durable-write:task-state=1*error(ENOSPC)");
    const body = taskBody();
    const res = await post("/api/tasks", body);
    expectTextError(res, 503, /^storage unavailable: ENOSPC: /);
    expect((await app.inject({ method: "GET", url: `/api/tasks/${String(body.id)}` })).statusCode).toBe(404);
    const health = (await app.inject({ method: "GET", url: "/api/healthcheck" })).json<{
      storage: { status: string; error?: string };
    }>();
    expect(health.storage).toMatchObject({
      status: "degraded",
      error: expect.stringMatching(/^ENOSPC: /) as unknown,
    });
    expect((await post("/api/tasks", body)).statusCode).toBe(200);
    await env.runner.awaitStarts();
  });

  it("a terminate whose intent cannot be written answers 503 and the task keeps its status", async () => {
    const id = await submitRunning();
    armFailpoints("durable-write:task-state=1*error(EIO)");
    const res = await post(`/api/tasks/${id}/terminate`, { termination_reason: "terminated_by_user" });
    expectTextError(res, 503, /^storage unavailable: EIO: /);
    const task = (await app.inject({ method: "GET", url: `/api/tasks/${id}` })).json<{ status: string }>();
    expect(task.status).toBe("running");
    expect(
      (await post(`/api/tasks/${id}/terminate`, { termination_reason: "terminated_by_user" })).statusCode,
    ).toBe(200);
  });
});

describe("GET /api/events (taskshim extension)", () => {
  it("streams the tasks present, then every status change as NDJSON, and ends when the server closes", async () => {
    const seeded = await env.seedTask();
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as { port: number };
    const response = await fetch(`http://127.0.0.1:${port}/api/events`);
    expect(response.headers.get("content-type")).toBe("application/x-ndjson; charset=utf-8");
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    const lines = async (n: number): Promise<Record<string, unknown>[]> => {
      while (text.split("\n").length <= n) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
      }
      return text
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    };
    expect((await lines(1))[0]).toMatchObject({
      kind: "present",
      id: seeded.task.id,
      from: null,
      to: "running",
    });

    // A task that goes through pending, preparing, pulling, creating, running and ends at once:
    // each status is in the stream, however short it lasted.
    const body = taskBody();
    const taskId = String(body.id);
    expect((await post("/api/tasks", body)).statusCode).toBe(200);
    await env.runner.awaitStarts();
    expect(
      (await post(`/api/tasks/${taskId}/terminate`, { termination_reason: "terminated_by_user" })).statusCode,
    ).toBe(200);
    const mine = (await lines(7)).filter((e) => e.id === taskId);
    expect(mine.map((e) => `${String(e.from)}>${String(e.to)}`)).toEqual([
      "null>pending",
      "pending>preparing",
      "preparing>pulling",
      "pulling>creating",
      "creating>running",
      "running>terminated",
    ]);
    expect(mine.at(-1)).toMatchObject({ kind: "changed", termination_reason: "terminated_by_user" });
    expect(String(mine[0]?.time)).toMatch(/^\d{4}-\d\d-\d\dT/);

    await app.close();
    // The stream ends with the server instead of holding its close up.
    for (;;) if ((await reader.read()).done) break;
  });
});
