import { filterTaskMetrics } from "../dcgm/metric-filter.js";
import { ExporterUnavailableError, MetricsFetchError } from "../dcgm/ports.js";
import { OPENAPI_SCHEMAS } from "../wire/schemas.js";
import type { ApiDeps } from "./api-deps.js";
import { openApiDocument, type ApiRoute } from "./openapi.js";
import { sendText, taskIdParam } from "./replies.js";

/** Prometheus' text format, as DCGM Exporter serves it. */
const EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

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
      summary: "A task's GPU metrics from DCGM Exporter (404 when there is none, 502 when it fails)",
      handler: async (request, reply) => {
        // dstack-shim's order (TaskMetricsHandler): the exporter, the task, the fetch.
        const source = deps.taskMetrics;
        if (!source) return sendText(reply, 404, "DCGM Exporter is not available");
        const task = deps.store.get(taskIdParam(request));
        if (!task) return sendText(reply, 404, "Task not found");
        // The response's close before it is sent: the client went away (the request's own close
        // fires once its body is read, which for a GET is at once).
        const closed = new AbortController();
        reply.raw.once("close", () => closed.abort());
        let exposition: string;
        try {
          exposition = await source.exposition(closed.signal);
        } catch (error) {
          if (error instanceof ExporterUnavailableError) {
            return sendText(reply, 404, "DCGM Exporter is not available");
          }
          if (error instanceof MetricsFetchError) return sendText(reply, 502, error.message);
          throw error;
        }
        return reply
          .header("content-type", EXPOSITION_CONTENT_TYPE)
          .send(filterTaskMetrics(exposition, task.gpuIds));
      },
    },
  ];
}
