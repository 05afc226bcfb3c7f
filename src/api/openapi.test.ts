import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { VERSION } from "../version.js";
import { Validator } from "@seriousme/openapi-schema-validator";
import { Ajv2020 } from "ajv/dist/2020.js";
import { buildTestApi } from "../testing/test-api.js";
import { OPERATIONS } from "./openapi.js";

const TOKEN = "s3cret-token-0123456789";
let env: TestEnv;

function api(authToken?: string) {
  return buildTestApi(env, authToken !== undefined ? { authToken } : {});
}

beforeEach(async () => {
  env = await makeContext();
});

afterEach(async () => {
  // Waits for the starts and removes the temp home (the runs of 3 December left one per test in /tmp).
  await env.dispose();
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
    const ref = doc.paths["/api/tasks"]?.post?.requestBody?.content["application/json"]?.schema as {
      $ref: string;
    };
    expect(ref.$ref).toBe("#/components/schemas/TaskConfig");
    const submit = (
      doc as unknown as { components: { schemas: Record<string, { properties: Record<string, unknown> }> } }
    ).components.schemas.TaskConfig!;
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
      `Basic ${TOKEN}`,
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

interface Operation {
  operationId: string;
  tags: string[];
  security?: unknown[];
  parameters?: { name: string; in: string }[];
  requestBody?: { content: Record<string, { schema: unknown }> };
  responses: Record<string, { content?: Record<string, { schema?: unknown }> }>;
}
type Doc = {
  servers: { url: string }[];
  components: { schemas: Record<string, unknown>; securitySchemes?: unknown };
  security?: unknown;
  paths: Record<string, Record<string, Operation>>;
};

async function documentOf(app: ReturnType<typeof api>, headers: Record<string, string> = {}): Promise<Doc> {
  await app.ready();
  return (
    await app.inject({
      method: "GET",
      url: "/api/openapi.json",
      headers: { host: "10.0.0.5:10998", ...headers },
    })
  ).json<Doc>();
}

describe("the OpenAPI document for client generators", () => {
  it("is valid OpenAPI 3.1 by a maintained validator, with and without a token", async () => {
    for (const token of [undefined, TOKEN]) {
      const doc = await documentOf(api(token), token ? { authorization: `Bearer ${token}` } : {});
      const validator = new Validator();
      const result = await validator.validate(doc);
      expect(result.errors ?? [], JSON.stringify(result.errors)).toEqual([]);
      expect(result.valid).toBe(true);
      expect(validator.version).toBe("3.1");
    }
  });

  it("names, tags and lists every status of every operation; shares schemas by $ref; writes enums as enum", async () => {
    const doc = await documentOf(api());
    expect(doc.servers).toEqual([{ url: "http://10.0.0.5:10998" }]);
    const ids = new Set<string>();
    for (const [path, methods] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(methods)) {
        const key = `${method.toUpperCase()} ${path}`;
        expect(op.operationId, key).toBe(OPERATIONS[key]?.operationId);
        expect(ids.has(op.operationId), op.operationId).toBe(false);
        ids.add(op.operationId);
        expect(op.tags, key).toHaveLength(1);
        expect(Object.keys(op.responses).sort(), key).toEqual(
          [...new Set(["200", ...Object.keys(OPERATIONS[key]?.statuses ?? {}), "503"])].sort(),
        );
      }
    }
    expect(
      doc.paths["/api/tasks/{id}"]?.get?.responses["200"]?.content?.["application/json"]?.schema,
    ).toEqual({
      $ref: "#/components/schemas/TaskInfo",
    });
    const taskInfo = doc.components.schemas.TaskInfo as { properties: { status: unknown } };
    expect(taskInfo.properties.status).toEqual({
      type: "string",
      enum: ["pending", "preparing", "pulling", "creating", "running", "terminated"],
    });
    expect(JSON.stringify(doc)).not.toMatch(/"anyOf":\[\{"const"/);
  });

  it("declares the bearer scheme only when a token is configured", async () => {
    const open = await documentOf(api());
    expect(open.components.securitySchemes).toBeUndefined();
    expect(JSON.stringify(open.paths)).not.toContain('"security"');
    const guarded = await documentOf(api(TOKEN), { authorization: `Bearer ${TOKEN}` });
    expect(guarded.components.securitySchemes).toEqual({ bearer: { type: "http", scheme: "bearer" } });
    expect(guarded.paths["/api/tasks"]?.get?.security).toEqual([{ bearer: [] }]);
    expect(guarded.paths["/api/healthcheck"]?.get?.security).toEqual([]);
    expect(Object.keys(guarded.paths["/api/tasks"]?.get?.responses ?? {})).toContain("401");
  });

  it("round-trips every operation: called as documented, it answers a documented status with a body of the documented schema", async () => {
    const app = api();
    const doc = await documentOf(app);
    const validator = new Validator();
    await validator.validate(doc);
    const resolved = validator.resolveRefs() as Doc;
    const ajv = new Ajv2020({ strict: false, validateFormats: false });
    // One task to address by {id}; a valid body for every operation that takes one.
    const submitted = await app.inject({
      method: "POST",
      url: "/api/tasks",
      payload: { id: "rt-1", name: "rt", image_name: "busybox:1.36", command: ["sleep", "60"] },
    });
    expect(submitted.statusCode).toBe(200);
    await env.runner.awaitStarts();
    const bodies: Record<string, unknown> = {
      submitTask: { id: "rt-2", name: "rt", image_name: "busybox:1.36", command: ["true"] },
      terminateTask: { termination_reason: "terminated_by_user", termination_message: "", timeout: 0 },
      installComponent: { name: "dstack-runner", url: "file:///nonexistent/dstack-runner" },
      shutdown: { force: false },
    };
    let called = 0;
    for (const [path, methods] of Object.entries(resolved.paths)) {
      for (const [method, op] of Object.entries(methods)) {
        if (op.operationId === "followTaskEvents") continue; // a stream without end: server.test.ts reads it
        const url = path.replace("{id}", "rt-1");
        const payload = bodies[op.operationId];
        if (op.requestBody) expect(payload, op.operationId).toBeDefined();
        const res = await app.inject({
          method: method.toUpperCase() as "GET",
          url,
          ...(payload !== undefined ? { payload: payload as object } : {}),
        });
        called++;
        expect(Object.keys(op.responses), `${op.operationId} answered ${res.statusCode}`).toContain(
          String(res.statusCode),
        );
        const schema = op.responses[String(res.statusCode)]?.content?.["application/json"]?.schema;
        if (schema !== undefined) {
          const valid = ajv.validate(schema as object, res.json());
          expect(valid, `${op.operationId}: ${ajv.errorsText()}`).toBe(true);
        }
        if (op.operationId === "terminateTask") await env.runner.awaitStarts();
      }
    }
    expect(called).toBe(Object.keys(OPERATIONS).length - 1);
  });
});
