import { OPENAPI_SCHEMAS } from "../wire/schemas.js";
import type { ApiDeps } from "./api-deps.js";
import { openApiDocument, type ApiRoute } from "./openapi.js";
import { sendText, taskIdParam } from "./replies.js";

/**
 * About the API and the shim rather than a resource: `GET /api/openapi.json` (the document of
 * `routes`, every route of the server, this one included), `GET /metrics` and a task's GPU metrics.
 */
export function metaRoutes(deps: ApiDeps, routes: () => readonly ApiRoute[]): ApiRoute[] {
  return [
    {
      method: "GET",
      url: "/api/openapi.json",
      summary: "This document",
      handler: (request) =>
        openApiDocument(routes(), deps.version, {
          serverUrl: `${request.protocol}://${request.host}`,
          authRequired: deps.authToken !== undefined,
          schemas: OPENAPI_SCHEMAS,
        }),
    },
    {
      method: "GET",
      url: "/metrics",
      summary: "Prometheus metrics of the shim",
      handler: async (_request, reply) =>
        reply.header("content-type", deps.metrics.registry.contentType).send(await deps.metrics.exposition()),
    },
    {
      method: "GET",
      url: "/metrics/tasks/:id",
      summary: "A task's GPU metrics from the DCGM exporter (404 when there is none)",
      handler: (request, reply) => {
        if (!deps.store.get(taskIdParam(request))) return sendText(reply, 404, "Task not found");
        return sendText(reply, 404, "DCGM Exporter is not available");
      },
    },
  ];
}
