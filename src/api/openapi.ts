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

const plainText = (description: string) => ({
  description,
  content: { "text/plain": { schema: { type: "string" } } },
});

/** Drops TypeBox's symbol keys (JSON does that too) and returns plain JSON Schema. */
function jsonSchema(schema: TSchema): unknown {
  return JSON.parse(JSON.stringify(schema)) as unknown;
}

/**
 * The OpenAPI 3.1 document of the routes, built from the same schemas that validate requests
 * (OpenAPI 3.1 schemas are JSON Schema, so they embed as they are).
 */
export function openApiDocument(routes: readonly ApiRoute[], version: string): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    const path = route.url.replace(/:(\w+)/g, "{$1}");
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
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = {
      summary: route.summary,
      ...(params.length + query.length > 0 ? { parameters: [...params, ...query] } : {}),
      ...(route.body
        ? {
            requestBody: {
              required: true,
              content: { "application/json": { schema: jsonSchema(route.body) } },
            },
          }
        : {}),
      ...(route.public ? { security: [] } : {}),
      responses: {
        "200": route.response
          ? { description: "OK", content: { "application/json": { schema: jsonSchema(route.response) } } }
          : plainText("OK (a text body, often just a newline)"),
        "4XX": plainText("A client error, with dstack-shim's plain-text message"),
        "5XX": plainText("An internal error, with a plain-text message"),
      },
    };
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "taskshim",
      version,
      description:
        "The dstack-shim compatible API of taskshim. Errors are plain text. Without --auth-token-file no " +
        "token is needed; with it, every route but the healthcheck needs `Authorization: Bearer <token>`.",
    },
    components: { securitySchemes: { bearer: { type: "http", scheme: "bearer" } } },
    security: [{ bearer: [] }],
    paths,
  };
}
