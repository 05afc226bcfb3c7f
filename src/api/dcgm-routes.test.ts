import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ComponentService } from "../components/component-service.js";
import { GpuHealthMonitor } from "../dcgm/health-monitor.js";
import {
  DCGM_HEALTH,
  ExporterUnavailableError,
  MetricsFetchError,
  type DcgmHealth,
  type GpuHealthView,
  type TaskMetricsSource,
} from "../dcgm/ports.js";
import { EXPORTER_GPUS, exporterText } from "../dcgm/test-support.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { FakeCommandRunner } from "../testing/fake-command-runner.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { VERSION } from "../version.js";
import { ShimMetrics } from "./metrics.js";
import { buildApi } from "./server.js";

/*
 * GET /metrics/tasks/{id} and GET /api/instance/health over fakes of the DCGM ports: every
 * answer dstack's server can get (ShimClient.get_task_metrics, get_instance_health).
 */

const THREE_NVIDIA_GPUS: GpuInventory = {
  vendor: "nvidia",
  gpus: EXPORTER_GPUS.map((id, index) => ({
    vendor: "nvidia" as const,
    name: "NVIDIA H100 80GB HBM3",
    vramMiB: 81_559,
    id,
    index,
    driverVersion: "570.86.15",
  })),
};

let env: TestEnv;

beforeEach(async () => {
  env = await makeContext({ inventory: THREE_NVIDIA_GPUS });
});

afterEach(async () => {
  await env.dispose();
});

function api(parts: { taskMetrics?: TaskMetricsSource; gpuHealth?: GpuHealthView }) {
  return buildApi({
    version: VERSION,
    store: env.ctx.store,
    docker: env.ctx.docker,
    runner: env.runner,
    reconciler: env.reconciler,
    inventory: env.ctx.inventory,
    components: new ComponentService(
      { runner: "/nonexistent/runner", shim: "/nonexistent/shim" },
      new FakeCommandRunner(),
      env.ctx.log,
      env.ctx.shutdown,
    ),
    log: env.ctx.log,
    metrics: new ShimMetrics(env.ctx.store, VERSION),
    requestShutdown: () => undefined,
    ...parts,
  });
}

const source = (answer: () => Promise<string>): TaskMetricsSource & { calls: number } => {
  const s = {
    calls: 0,
    exposition: () => {
      s.calls += 1;
      return answer();
    },
  };
  return s;
};

describe("GET /metrics/tasks/{id}", () => {
  it("answers the exporter's samples of the task's GPUs only, in Prometheus' text format", async () => {
    // The lock hands out GPU 0 first: the first task holds GPU 0, the second GPUs 1 and 2.
    await env.seedTask({ config: { id: "one", name: "one" }, gpus: 1 });
    const { task } = await env.seedTask({ config: { id: "two", name: "two" }, gpus: 2 });
    expect(task.gpuIds).toEqual([EXPORTER_GPUS[1], EXPORTER_GPUS[2]]);
    const app = api({ taskMetrics: source(() => Promise.resolve(exporterText())) });
    const one = await app.inject({ method: "GET", url: "/metrics/tasks/one" });
    expect(one.statusCode).toBe(200);
    expect(one.headers["content-type"]).toBe("text/plain; version=0.0.4; charset=utf-8");
    expect(one.body).toContain(EXPORTER_GPUS[0]);
    expect(one.body).not.toContain(EXPORTER_GPUS[1]);
    expect(one.body).not.toContain(EXPORTER_GPUS[2]);
    expect(one.body.split("\n").filter((l) => l.startsWith("DCGM_"))).toHaveLength(3);
    const two = await app.inject({ method: "GET", url: "/metrics/tasks/two" });
    expect(two.body).not.toContain(EXPORTER_GPUS[0]);
    // Two GPUs × three metrics, and GPU 2's XID sample.
    expect(two.body.split("\n").filter((l) => l.startsWith("DCGM_"))).toHaveLength(7);
    await app.close();
  });

  it("answers 200 and nothing for a task without GPUs", async () => {
    await env.seedTask({ config: { id: "cpu", name: "cpu" } });
    const app = api({ taskMetrics: source(() => Promise.resolve(exporterText())) });
    const answer = await app.inject({ method: "GET", url: "/metrics/tasks/cpu" });
    expect([answer.statusCode, answer.body]).toEqual([200, ""]);
    await app.close();
  });

  it("answers 404 'DCGM Exporter is not available' without an exporter, before looking the task up (dstack-shim's order)", async () => {
    const app = api({});
    for (const url of ["/metrics/tasks/unknown", "/metrics/tasks/one"]) {
      const answer = await app.inject({ method: "GET", url });
      expect([answer.statusCode, answer.body]).toEqual([404, "DCGM Exporter is not available\n"]);
    }
    await app.close();
  });

  it("answers the same 404 when the exporter failed its version check (none will run)", async () => {
    await env.seedTask({ config: { id: "one", name: "one" }, gpus: 1 });
    const app = api({
      taskMetrics: source(() =>
        Promise.reject(new ExporterUnavailableError("dcgm-exporter -v: exit status 1")),
      ),
    });
    const answer = await app.inject({ method: "GET", url: "/metrics/tasks/one" });
    expect([answer.statusCode, answer.body]).toEqual([404, "DCGM Exporter is not available\n"]);
    await app.close();
  });

  it("answers 404 'Task not found' for an unknown task, without asking the exporter", async () => {
    const metrics = source(() => Promise.resolve(exporterText()));
    const app = api({ taskMetrics: metrics });
    const answer = await app.inject({ method: "GET", url: "/metrics/tasks/nope" });
    expect([answer.statusCode, answer.body]).toEqual([404, "Task not found\n"]);
    expect(metrics.calls).toBe(0);
    await app.close();
  });

  it("answers 502 with the fetch's error when the exporter fails (dstack's server logs it and goes on)", async () => {
    await env.seedTask({ config: { id: "one", name: "one" }, gpus: 1 });
    const app = api({
      taskMetrics: source(() =>
        Promise.reject(new MetricsFetchError("cannot fetch http://localhost:10997/metrics: fetch failed")),
      ),
    });
    const answer = await app.inject({ method: "GET", url: "/metrics/tasks/one" });
    expect(answer.statusCode).toBe(502);
    expect(answer.body).toBe("cannot fetch http://localhost:10997/metrics: fetch failed\n");
    await app.close();
  });

  it("answers 500 for an error that is not the exporter's (a bug, not a gateway failure)", async () => {
    await env.seedTask({ config: { id: "one", name: "one" }, gpus: 1 });
    const app = api({ taskMetrics: source(() => Promise.reject(new TypeError("boom"))) });
    const answer = await app.inject({ method: "GET", url: "/metrics/tasks/one" });
    expect(answer.statusCode).toBe(500);
    await app.close();
  });
});

describe("GET /api/instance/health", () => {
  const health: DcgmHealth = {
    overall_health: DCGM_HEALTH.fail,
    incidents: [
      {
        system: 0x10,
        health: DCGM_HEALTH.fail,
        error_message: "Detected 888 volatile double-bit ECC error(s) in GPU 0.",
        error_code: 0,
        entity_group_id: 1,
        entity_id: 0,
      },
    ],
  };

  it("answers {dcgm: null} without a health source", async () => {
    const app = api({});
    const answer = await app.inject({ method: "GET", url: "/api/instance/health" });
    expect([answer.statusCode, answer.json()]).toEqual([200, { dcgm: null }]);
    await app.close();
  });

  it("answers the source's last health in dstack's shape, and null when it has none", async () => {
    let current: DcgmHealth | null = health;
    const app = api({ gpuHealth: { current: () => current } });
    const answer = await app.inject({ method: "GET", url: "/api/instance/health" });
    expect(answer.json()).toEqual({
      dcgm: {
        overall_health: 20,
        incidents: [
          {
            system: 16,
            health: 20,
            error_message: "Detected 888 volatile double-bit ECC error(s) in GPU 0.",
            error_code: 0,
            entity_group_id: 1,
            entity_id: 0,
          },
        ],
      },
    });
    current = null;
    expect((await app.inject({ method: "GET", url: "/api/instance/health" })).json()).toEqual({ dcgm: null });
    await app.close();
  });

  it("answers at once while the health source hangs (null before its first answer)", async () => {
    const hung = { name: "hung", check: () => new Promise<DcgmHealth>(() => undefined) };
    const monitor = new GpuHealthMonitor(hung, () => undefined, { deadlineMs: 60_000, periodMs: 60_000 });
    const shutdown = new AbortController();
    const running = monitor.run(shutdown.signal);
    const app = api({ gpuHealth: monitor });
    const startedAt = performance.now();
    const answer = await app.inject({ method: "GET", url: "/api/instance/health" });
    expect(performance.now() - startedAt).toBeLessThan(500);
    expect(answer.json()).toEqual({ dcgm: null });
    shutdown.abort();
    await running;
    await app.close();
  });
});
