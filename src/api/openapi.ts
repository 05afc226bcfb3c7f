import type { FastifyReply, FastifyRequest, HTTPMethods } from "fastify";
import type { TSchema } from "typebox";

/** One route of the API with the schemas that describe it. */
export interface ApiRoute {
  readonly method: HTTPMethods;
  readonly url: string;
  readonly summary: string;
  /** Served without a token even when one is configured. */
  readonly public?: boolean;
  readonly body?: TSchema;
  readonly query?: TSchema;
  readonly response?: TSchema;
  readonly handler: (request: FastifyRequest, reply: FastifyReply) => unknown;
}

/** What an operation is called in generated clients, its group, and every status it answers. */
interface OperationDoc {
  readonly operationId: string;
  readonly tag: "health" | "instance" | "components" | "tasks" | "metrics" | "meta";
  /** Status → description of the plain-text (or JSON for 200) answer. */
  readonly statuses: Readonly<Record<string, string>>;
  /** The 200 answer's media type when it is not JSON. */
  readonly okType?: string;
}

const BODY_ERRORS = {
  "400": "The body is empty, not JSON, not an object, or a field is invalid (the message names it)",
  "413": "The body is larger than 1 MiB",
  "415": "The Content-Type is not JSON",
};

/**
 * Every operation's documentation, keyed by `METHOD url`. A route without an entry fails the
 * OpenAPI test, so a new route cannot go undocumented.
 */
export const OPERATIONS: Readonly<Record<string, OperationDoc>> = {
  "GET /api/healthcheck": { operationId: "getHealthcheck", tag: "health", statuses: {} },
  "POST /api/shutdown": {
    operationId: "shutdown",
    tag: "health",
    statuses: BODY_ERRORS,
    okType: "text/plain",
  },
  "GET /api/instance/health": { operationId: "getInstanceHealth", tag: "instance", statuses: {} },
  "GET /api/instance/info": { operationId: "getInstanceInfo", tag: "instance", statuses: {} },
  "GET /api/components": { operationId: "listComponents", tag: "components", statuses: {} },
  "POST /api/components/install": {
    operationId: "installComponent",
    tag: "components",
    statuses: { ...BODY_ERRORS, "409": "An install of this component is under way" },
    okType: "text/plain",
  },
  "GET /api/tasks": { operationId: "listTasks", tag: "tasks", statuses: {} },
  "POST /api/tasks": {
    operationId: "submitTask",
    tag: "tasks",
    statuses: {
      ...BODY_ERRORS,
      "400":
        "An invalid config (the message names the field), or the runner binary is missing for a task without command",
      "409": "A task with this id exists with a different config",
      "500": "The task dir could not be created",
    },
  },
  "GET /api/tasks/{id}": {
    operationId: "getTask",
    tag: "tasks",
    statuses: { "404": "No such task" },
  },
  "GET /api/tasks/{id}/logs": {
    operationId: "getTaskLogs",
    tag: "tasks",
    statuses: {
      "400": "tail is not an integer from 1 to 10000",
      "404": "No such task",
      "410": "The task's container is gone (removed)",
      "500": "The logs could not be read (the engine did not answer)",
    },
    okType: "text/plain",
  },
  "GET /api/events": {
    operationId: "followTaskEvents",
    tag: "tasks",
    statuses: {
      "503": "The shim is shutting down, or all the event streams --max-event-streams allows are open",
    },
    okType: "application/x-ndjson",
  },
  "POST /api/tasks/{id}/terminate": {
    operationId: "terminateTask",
    tag: "tasks",
    statuses: { ...BODY_ERRORS, "404": "No such task", "500": "The container could not be stopped" },
  },
  "POST /api/tasks/{id}/remove": {
    operationId: "removeTask",
    tag: "tasks",
    statuses: {
      "404": "No such task",
      "409": "The task is not terminated",
      "500": "The container's removal could not be confirmed",
    },
    okType: "text/plain",
  },
  "GET /api/openapi.json": { operationId: "getOpenApiDocument", tag: "meta", statuses: {} },
  "GET /metrics": {
    operationId: "getMetrics",
    tag: "metrics",
    statuses: {},
    okType: "text/plain",
  },
  "GET /metrics/tasks/{id}": {
    operationId: "getTaskMetrics",
    tag: "metrics",
    statuses: {
      "404": "No DCGM Exporter runs (DCGM Exporter is not available), or no such task",
      "502": "DCGM Exporter did not answer (the message says why)",
    },
    okType: "text/plain",
  },
};

const TAGS = [
  { name: "health", description: "Liveness and shutdown" },
  { name: "instance", description: "The host: GPUs and their health" },
  { name: "components", description: "The runner and shim binaries" },
  { name: "tasks", description: "Tasks and their containers" },
  { name: "metrics", description: "Prometheus metrics" },
  { name: "meta", description: "This document" },
];

const plainText = (description: string) => ({
  description,
  content: { "text/plain": { schema: { type: "string" } } },
});

/**
 * Drops TypeBox's symbol keys (JSON does that too), and writes a union of constants as `enum`
 * (code generators make an enum type of it; an `anyOf` of `const`s becomes a union of nothing).
 */
export function jsonSchema(schema: TSchema): unknown {
  return enums(JSON.parse(JSON.stringify(schema)) as unknown);
}

function enums(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(enums);
  if (typeof value !== "object" || value === null) return value;
  const record = value as Record<string, unknown>;
  const options = record.anyOf;
  if (
    Array.isArray(options) &&
    options.length > 0 &&
    options.every(
      (o) =>
        typeof o === "object" &&
        o !== null &&
        "const" in o &&
        typeof (o as { const: unknown }).const === "string",
    )
  ) {
    const { anyOf: _anyOf, ...rest } = record;
    return { ...rest, type: "string", enum: options.map((o) => (o as { const: string }).const) };
  }
  return Object.fromEntries(Object.entries(record).map(([k, v]) => [k, enums(v)]));
}

/** Options of {@link openApiDocument}. */
export interface OpenApiOptions {
  /** The URL clients reach this shim at (from the request that asks for the document). */
  readonly serverUrl: string;
  /** Whether the shim was started with --auth-token-file: the bearer scheme is declared then only. */
  readonly authRequired: boolean;
  /** Shared schemas by name, each written once under `components.schemas` and referenced. */
  readonly schemas: Readonly<Record<string, TSchema>>;
}

/**
 * The OpenAPI 3.1 document of the routes, built from the same schemas that validate requests
 * (OpenAPI 3.1 schemas are JSON Schema, so they embed as they are).
 */
export function openApiDocument(
  routes: readonly ApiRoute[],
  version: string,
  options: OpenApiOptions,
): Record<string, unknown> {
  const names = new Map<TSchema, string>(Object.entries(options.schemas).map(([name, s]) => [s, name]));
  const schemaOf = (schema: TSchema): unknown => {
    const name = names.get(schema);
    return name ? { $ref: `#/components/schemas/${name}` } : jsonSchema(schema);
  };
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    const path = route.url.replace(/:(\w+)/g, "{$1}");
    const doc = OPERATIONS[`${route.method} ${path}`];
    if (!doc) throw new Error(`route ${route.method} ${path} is not documented in OPERATIONS`);
    const params = [...route.url.matchAll(/:(\w+)/g)].map((m) => ({
      name: m[1],
      in: "path",
      required: true,
      schema: { type: "string" },
    }));
    const query = route.query
      ? Object.entries(
          (jsonSchema(route.query) as { properties?: Record<string, unknown> }).properties ?? {},
        ).map(([name, schema]) => ({ name, in: "query", required: false, schema }))
      : [];
    const secured = options.authRequired && route.public !== true;
    const ok = route.response
      ? { description: "OK", content: { "application/json": { schema: schemaOf(route.response) } } }
      : {
          description: "OK",
          content: { [doc.okType ?? "text/plain"]: { schema: { type: "string" } } },
        };
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = {
      operationId: doc.operationId,
      tags: [doc.tag],
      summary: route.summary,
      ...(params.length + query.length > 0 ? { parameters: [...params, ...query] } : {}),
      ...(route.body
        ? {
            requestBody: {
              required: true,
              content: { "application/json": { schema: schemaOf(route.body) } },
            },
          }
        : {}),
      ...(options.authRequired ? { security: secured ? [{ bearer: [] }] : [] } : {}),
      responses: {
        "200": ok,
        // A route's own 503 (below) says more than this one.
        "503": plainText("The shim is shutting down"),
        ...Object.fromEntries(
          Object.entries(doc.statuses).map(([status, text]) => [status, plainText(text)]),
        ),
        ...(secured ? { "401": plainText("The bearer token is missing or wrong") } : {}),
      },
    };
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "taskshim",
      version,
      description:
        "The dstack-shim compatible API of taskshim, with taskshim's extensions (task times and exit codes, logs, the event stream). Errors are plain text.",
    },
    servers: [{ url: options.serverUrl }],
    tags: TAGS,
    components: {
      schemas: Object.fromEntries(Object.entries(options.schemas).map(([name, s]) => [name, jsonSchema(s)])),
      ...(options.authRequired ? { securitySchemes: { bearer: { type: "http", scheme: "bearer" } } } : {}),
    },
    paths,
  };
}
