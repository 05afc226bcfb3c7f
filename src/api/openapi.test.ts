import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeContext, type TestEnv } from "../runner/test-support.js";
import { VERSION } from "../version.js";
import { buildTestApi } from "./test-api.js";

const TOKEN = "s3cret-token-0123456789";
let env: TestEnv;

function api(authToken?: string) {
  return buildTestApi(env, authToken !== undefined ? { authToken } : {});
}

beforeEach(async () => {
  env = await makeContext();
});

afterEach(async () => {
  await env.runner.awaitStarts();
});

describe("GET /api/openapi.json", () => {
  it("documents every route the server has, with the schemas that validate bodies", async () => {
    const app = api();
    await app.ready();
    const doc = (await app.inject({ method: "GET", url: "/api/openapi.json" })).json<{
      openapi: string;
      info: { version: string };
      paths: Record<
        string,
        Record<string, { requestBody?: { content: Record<string, { schema: unknown }> } }>
      >;
    }>();
    expect(doc.openapi).toBe("3.1.0");
    expect(doc.info.version).toBe(VERSION);
    const documented = Object.entries(doc.paths).map(([path, methods]) => ({
      url: path.replace(/\{(\w+)\}/g, ":$1"),
      methods: Object.keys(methods).map((m) => m.toUpperCase()),
    }));
    expect(
      documented
        .map((d) => d.methods.map((m) => `${m} ${d.url}`))
        .flat()
        .sort(),
    ).toEqual(
      [
        "GET /api/healthcheck",
        "POST /api/shutdown",
        "GET /api/instance/health",
        "GET /api/instance/info",
        "GET /api/components",
        "POST /api/components/install",
        "GET /api/tasks",
        "POST /api/tasks",
        "GET /api/tasks/:id",
        "GET /api/tasks/:id/logs",
        "GET /api/events",
        "POST /api/tasks/:id/terminate",
        "POST /api/tasks/:id/remove",
        "GET /api/openapi.json",
        "GET /metrics",
        "GET /metrics/tasks/:id",
      ].sort(),
    );
    // The server agrees: a documented method is routed, any other method on the path is 405.
    for (const { url, methods } of documented) {
      const concrete = url.replace(/:(\w+)/g, "x");
      for (const method of ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] as const) {
        // The event stream never ends by itself (inject would wait forever); server.test.ts reads it.
        if (method === "GET" && url === "/api/events") continue;
        const res = await app.inject({ method, url: concrete });
        if (methods.includes(method)) {
          expect(res.statusCode, `${method} ${url}`).not.toBe(405);
          expect(res.body, `${method} ${url}`).not.toBe("404 page not found\n");
        } else {
          expect(res.statusCode, `${method} ${url}`).toBe(405);
        }
      }
    }
    // And it has no route on a path the document does not name.
    const routed = [...app.printRoutes({ commonPrefix: false }).matchAll(/(\/[^\s(]*)/g)].map(
      (m) => m[1] ?? "",
    );
    for (const segment of routed) {
      expect(
        documented.some((d) => d.url.includes(segment)),
        segment,
      ).toBe(true);
    }
    const submit = doc.paths["/api/tasks"]?.post?.requestBody?.content["application/json"]?.schema as {
      properties: Record<string, unknown>;
    };
    expect(Object.keys(submit.properties)).toEqual(
      expect.arrayContaining(["id", "name", "image_name", "gpu"]),
    );
  });
});

describe("--auth-token-file", () => {
  it("requires the bearer token everywhere but the healthcheck", async () => {
    const app = api(TOKEN);
    expect((await app.inject({ method: "GET", url: "/api/healthcheck" })).statusCode).toBe(200);
    const denied = await app.inject({ method: "GET", url: "/api/tasks" });
    expect(denied.statusCode).toBe(401);
    expect(denied.body).toBe("unauthorized\n");
    expect(denied.headers["www-authenticate"]).toBe("Bearer");
    for (const authorization of [
      `Bearer ${TOKEN}x`,
      `Bearer ${TOKEN.slice(1)}`,
      TOKEN,
      "Bearer ",
      `bearer ${TOKEN}`,
    ]) {
      expect(
        (await app.inject({ method: "GET", url: "/api/tasks", headers: { authorization } })).statusCode,
      ).toBe(401);
    }
    const allowed = await app.inject({
      method: "GET",
      url: "/api/tasks",
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    expect(allowed.statusCode).toBe(200);
    // A rejected submit changes nothing.
    const submit = await app.inject({
      method: "POST",
      url: "/api/tasks",
      payload: { id: "t1", name: "n", image_name: "busybox:1" },
    });
    expect(submit.statusCode).toBe(401);
    expect(env.ctx.store.size).toBe(0);
  });

  it("lets unknown paths answer 401 rather than reveal which exist", async () => {
    const app = api(TOKEN);
    expect((await app.inject({ method: "GET", url: "/nope" })).statusCode).toBe(401);
  });
});
