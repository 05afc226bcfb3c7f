import { createHash, timingSafeEqual } from "node:crypto";
import Fastify, { LogController, type HTTPMethods } from "fastify";
import { ComponentRequestError } from "../components/component-service.js";
import { TaskConflictError, TaskOperationError, TaskStateError } from "../runner/task-runner.js";
import { StorageUnavailableError } from "../state/storage-health.js";
import { EngineMismatchError } from "../runner/engine-guard.js";
import { InvalidTaskConfigError } from "../tasks/task-config.js";
import { TaskNotFoundError } from "../tasks/task-store.js";
import type { ApiDeps } from "./api-deps.js";
import { componentRoutes } from "./component-routes.js";
import { ConnectionDrain, DRAIN_TIMES } from "./connection-drain.js";
import { EventStreams } from "./event-streams.js";
import { healthRoutes, instanceRoutes } from "./health-routes.js";
import { BODY_LIMIT_BYTES, HttpError } from "./http-errors.js";
import { metaRoutes } from "./meta-routes.js";
import type { ApiRoute } from "./openapi.js";
import { answerClientError } from "./parser-errors.js";
import { sendText } from "./replies.js";
import { taskRoutes } from "./task-routes.js";

/*
 * The small server around the routes: fastify's setup, the plain-text error mapping, the drain
 * and the bearer token, applied to every route alike. The routes live per resource
 * (health-routes, component-routes, task-routes, meta-routes).
 */

/** GET and HEAD: answered from memory, so still answered while the server drains. */
function isRead(method: string): boolean {
  return method === "GET" || method === "HEAD";
}

const ALL_METHODS: HTTPMethods[] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];

/** The HTTP edge's limits (docs/api.md, "Limits"). */
export const HTTP_LIMITS = {
  /** The request line and headers must arrive within this. */
  headersTimeoutMs: 10_000,
  /** The whole request, body included, must arrive within this. */
  requestTimeoutMs: 30_000,
  /** How often Node checks the two deadlines above. */
  checkIntervalMs: 1_000,
  /** Concurrent connections; more are refused (closed at once) and counted. */
  maxConnections: 1_000,
} as const;

/**
 * Builds the HTTP API, wire-compatible with dstack-shim: the same paths, JSON keys, status
 * codes and plain-text error bodies. Reads are answered from memory and never wait on Docker.
 */
export function buildApi(deps: ApiDeps) {
  const app = createApp(deps);
  mapErrors(app);
  // Open event streams end when the server closes, or its close would wait for them forever.
  const eventStreams = new EventStreams(deps.store, deps.eventStreams, {
    open: (count) => deps.metrics.eventStreams.set(count),
    refused: () => deps.metrics.eventStreamsRefused.inc(),
    cutOff: (reason) => deps.metrics.eventStreamsCutOff.inc({ reason }),
  });
  addDrain(app, deps, eventStreams);
  const routes: ApiRoute[] = [
    ...healthRoutes(deps),
    ...instanceRoutes(deps),
    ...componentRoutes(deps),
    ...taskRoutes(deps, eventStreams),
    ...metaRoutes(deps, () => routes),
  ];
  if (deps.authToken !== undefined) requireToken(app, deps.authToken, routes);
  registerRoutes(app, routes);
  return app;
}

/** The fastify instance of the API (its logger is the shim's pino logger). */
type ShimApp = ReturnType<typeof createApp>;

function createApp(deps: ApiDeps) {
  const app = Fastify({
    loggerInstance: deps.log,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: BODY_LIMIT_BYTES,
    // A client that trickles its headers or body is cut (408, then closed): it cannot hold a
    // connection for ever. Node checks these deadlines every `connectionsCheckingInterval`.
    requestTimeout: HTTP_LIMITS.requestTimeoutMs,
    http: {
      headersTimeout: HTTP_LIMITS.headersTimeoutMs,
      requestTimeout: HTTP_LIMITS.requestTimeoutMs,
      connectionsCheckingInterval: HTTP_LIMITS.checkIntervalMs,
    },
    // Errors of the HTTP parser (malformed request 400, 408, 431) answered in plain text too.
    clientErrorHandler: answerClientError,
    forceCloseConnections: "idle",
    // Both answered below in plain text, as every other error is.
    return503OnClosing: false,
    frameworkErrors: (error, _request, reply) => {
      const tooLong = error.code === "FST_ERR_MAX_PARAM_LENGTH";
      void sendText(reply, tooLong ? 414 : 400, tooLong ? "URI Too Long" : "Bad Request: invalid URL");
    },
    routerOptions: { maxParamLength: 256 },
    // No per-request child logger: request logging is off, and a pino child with our redaction
    // cost ~4 % of the CPU of a GET under load. The one request log line names its URL.
    childLoggerFactory: (logger) => logger,
    // No route declares a schema (bodies are checked with TypeBox in the routes), so fastify's
    // own compilers (ajv, fast-json-stringify) are never needed; without these factories it loads
    // them anyway, at every start (CPU and heap).
    schemaController: {
      compilersFactory: { buildValidator: noSchemaCompiler, buildSerializer: noSchemaCompiler },
    },
  });
  // Bodies are decoded by the routes with dstack-shim's rules, whatever the Content-Type.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "buffer" }, (_request, payload, done) => done(null, payload));
  // Beyond the cap Node drops a new connection at once (no answer), counted in the metric.
  app.server.maxConnections = HTTP_LIMITS.maxConnections;
  app.server.on("drop", () => deps.metrics.connectionsRefused.inc());
  return app;
}

/** The first error of `type` in `error`'s cause chain. */
function causeOfType<E extends Error>(error: unknown, type: new (...args: never[]) => E): E | undefined {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof type) return e;
  }
  return undefined;
}

/** Every error a route throws, as dstack-shim answers it: a status and one plain-text line. */
function mapErrors(app: ShimApp): void {
  app.setErrorHandler((error: Error & { statusCode?: number; code?: string }, request, reply) => {
    if (error instanceof HttpError) return sendText(reply, error.statusCode, error.message);
    if (error.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
      return sendText(reply, 413, "Request body must not be larger than 1MB");
    }
    if (error instanceof TaskNotFoundError) return sendText(reply, 404, error.message);
    if (error instanceof ComponentRequestError) {
      return sendText(reply, error.kind === "busy" ? 409 : 400, error.message);
    }
    if (error instanceof InvalidTaskConfigError) return sendText(reply, 400, error.message);
    if (error instanceof TaskConflictError || error instanceof TaskStateError) {
      return sendText(reply, 409, `request error: ${error.message}`);
    }
    if (error instanceof StorageUnavailableError)
      return sendText(reply, 503, error.message, { verbatim: true });
    // Nothing was changed: the engine answering is not this home's (runner/engine-guard.ts).
    const mismatch = causeOfType(error, EngineMismatchError);
    if (mismatch) return sendText(reply, 503, `engine mismatch: ${mismatch.message}`);
    if (error instanceof TaskOperationError) return sendText(reply, 500, `internal error: ${error.message}`);
    if (typeof error.statusCode === "number" && error.statusCode >= 400 && error.statusCode < 500) {
      return sendText(reply, error.statusCode, error.message);
    }
    request.log.error({ err: error, url: request.url }, "request failed");
    return sendText(reply, 500, "internal error");
  });
  app.setNotFoundHandler((_request, reply) => sendText(reply, 404, "404 page not found"));
}

/** How the server closes: reads still answered, changes refused, connections drained. */
function addDrain(app: ShimApp, deps: ApiDeps, eventStreams: EventStreams): void {
  let closing = false;
  app.addHook("preClose", (done) => {
    closing = true;
    done();
  });
  // While the server drains (below), a read that arrives on a connection the client kept open is
  // answered as ever, from memory, and its connection then closes: the client's request is not
  // lost in the restart. Changes and new event streams are refused: the shim is going away.
  // A callback hook, not an async one: no promise for every request.
  app.addHook("onRequest", (request, reply, done) => {
    if (closing && !(isRead(request.method) && request.routeOptions.url !== "/api/events")) {
      void sendText(reply.header("connection", "close"), 503, "shutting down");
      return;
    }
    done();
  });
  app.addHook("preClose", (done) => {
    eventStreams.closeAll();
    done();
  });
  // The last preClose hook: fastify's own close (Node's http.Server#close) would destroy every
  // connection without a request in progress at once, requests already written by the client
  // included (connection-drain.ts). By the time it runs, the drain has closed them all.
  const drain = new ConnectionDrain(app.server, deps.handoff);
  app.addHook("preClose", () => drain.drain(deps.drainTimes ?? DRAIN_TIMES));
}

/** Every route but the public ones needs `Authorization: Bearer <token>`. */
function requireToken(app: ShimApp, token: string, routes: readonly ApiRoute[]): void {
  const expected = createHash("sha256").update(token).digest();
  const open = new Set(routes.filter((r) => r.public).map((r) => r.url));
  app.addHook("onRequest", async (request, reply) => {
    if (open.has(request.routeOptions.url ?? "")) return;
    // The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is "Bearer".
    const given = /^bearer +(\S+) *$/i.exec(request.headers.authorization ?? "")?.[1] ?? "";
    // Hashing first gives equal lengths, so the comparison takes the same time for any token.
    const hashed = createHash("sha256").update(given).digest();
    if (given === "" || !timingSafeEqual(hashed, expected)) {
      // Closed after the answer: a body still on its way is not read any longer.
      await sendText(
        reply.header("www-authenticate", "Bearer").header("connection", "close"),
        401,
        "unauthorized",
      );
    }
  });
}

/** The routes, and for each path a 405 naming the methods it has. */
function registerRoutes(app: ShimApp, routes: readonly ApiRoute[]): void {
  const byUrl = new Map<string, HTTPMethods[]>();
  for (const route of routes) {
    app.route({ method: route.method, url: route.url, handler: route.handler });
    byUrl.set(route.url, [...(byUrl.get(route.url) ?? []), route.method]);
  }
  for (const [url, methods] of byUrl) {
    const others = ALL_METHODS.filter(
      (m) => !methods.includes(m) && !(m === "HEAD" && methods.includes("GET")),
    );
    app.route({
      method: others,
      url,
      handler: (_request, reply) =>
        sendText(reply.header("allow", methods.join(", ")), 405, "Method Not Allowed"),
    });
  }
}

/** What fastify would build a route schema's validator or serializer with: no route has one. */
function noSchemaCompiler(): never {
  throw new Error("taskshim routes declare no schema: a body is checked in its route (TypeBox)");
}
