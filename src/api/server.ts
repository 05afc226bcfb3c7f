import { createHash, timingSafeEqual } from "node:crypto";
import type { Socket } from "node:net";
import { constants as osConstants } from "node:os";
import Fastify, { LogController, type FastifyReply, type FastifyRequest, type HTTPMethods } from "fastify";
import type { Static, TSchema } from "typebox";
import type { Logger } from "pino";
import { ComponentRequestError, type ComponentService } from "../components/component-service.js";
import type { DockerClient } from "../docker/docker-client.js";
import type { EngineInfo } from "../docker/engine-info.js";
import type { ShimPhaseView } from "../lifecycle/shim-lifecycle.js";
import { DockerNotFoundError } from "../docker/docker-errors.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import type { Reconciler } from "../runner/reconciler.js";
import { StorageUnavailableError, type StorageHealth } from "../state/storage-health.js";
import type { HomeHealth } from "../state/home-watch.js";
import {
  TaskConflictError,
  TaskOperationError,
  TaskStateError,
  type TaskRunner,
} from "../runner/task-runner.js";
import { InvalidTaskConfigError, parseTaskConfig, TaskSubmitBodySchema } from "../tasks/task-config.js";
import { TaskNotFoundError, type TaskStore } from "../tasks/task-store.js";
import { normalizeTerminationReason, type TerminationReason } from "../tasks/termination-reason.js";
import {
  ConnectionDrain,
  DRAIN_TIMES,
  idleSinceHandoff,
  type ConnectionHandoff,
  type DrainTimes,
} from "./connection-drain.js";
import { EventStreams, type EventStreamLimits } from "./event-streams.js";
import { BODY_LIMIT_BYTES, decodeObjectBody, HttpError } from "./http-errors.js";
import type { ShimMetrics } from "./metrics.js";
import { openApiDocument, type ApiRoute } from "./openapi.js";
import {
  checkBody,
  ComponentInstallBody,
  Components,
  Healthcheck,
  InstanceHealth,
  InstanceInfo,
  LogsQuery,
  ShutdownBody,
  TaskInfo,
  TaskList,
  TerminateBody,
} from "./schemas.js";
import { taskInfo, taskInfoJson } from "./wire.js";
import { errorMessage } from "../errors/error-message.js";
import { BUILD, type BuildIdentity } from "../version.js";

/** What the HTTP edge needs from the rest of the shim. */
export interface ApiDeps {
  readonly version: string;
  readonly store: TaskStore;
  /** Used only for the logs extension; every other read is answered from memory. */
  readonly docker: DockerClient;
  readonly runner: TaskRunner;
  readonly reconciler: Reconciler;
  readonly inventory: GpuInventory;
  readonly components: ComponentService;
  readonly log: Logger;
  readonly metrics: ShimMetrics;
  /** The healthcheck's `build` (commit, dirty, build id); absent: this process's, `BUILD`. */
  readonly build?: BuildIdentity;
  /** Which engine the shim drives (the healthcheck's `engine.kind` and `version`), once known. */
  readonly engineInfo?: () => EngineInfo | undefined;
  /** The shim process's phase (the healthcheck's `lifecycle`); absent: not reported. */
  readonly lifecycle?: () => ShimPhaseView;
  /** The home's storage health (the healthcheck's `storage`); absent: reported ok. */
  readonly storage?: StorageHealth;
  /** When set, every route but the healthcheck needs `Authorization: Bearer <token>`. */
  readonly authToken?: string;
  /** Starts a graceful (or forced) shutdown; the process exits 0 once it is done. */
  requestShutdown(force: boolean): void;
  /** Whether the home is still the one the shim started on (the `home` healthcheck field). */
  readonly homeHealth?: () => HomeHealth;
  /** How long `close()` keeps open connections to answer what arrives on them (default DRAIN_TIMES). */
  readonly drainTimes?: DrainTimes;
  /** Where idle connections go when the server drains, instead of being closed (the next shim). */
  readonly handoff?: ConnectionHandoff;
  /** Bounds of `GET /api/events` (default EVENT_STREAM_LIMITS; `--max-event-streams`). */
  readonly eventStreams?: Partial<EventStreamLimits>;
}

/** GET and HEAD: answered from memory, so still answered while the server drains. */
function isRead(method: string): boolean {
  return method === "GET" || method === "HEAD";
}

const ALL_METHODS: HTTPMethods[] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
const MAX_LOG_TAIL = 10_000;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f]/;

/** Sends JSON text serialized beforehand (fastify sends a string as it is). */
function sendJson(reply: FastifyReply, json: string): FastifyReply {
  return reply.header("content-type", "application/json; charset=utf-8").send(json);
}

/**
 * A plain-text answer. An error's message is cut to one line without errno codes, unless it is
 * `verbatim`: a message the API composes on purpose, such as `storage unavailable: ENOSPC: …`,
 * whose errno name is the operator's answer.
 */
function sendText(
  reply: FastifyReply,
  status: number,
  message: string,
  options: { verbatim?: boolean } = {},
): FastifyReply {
  const text = status < 400 ? message : options.verbatim ? firstLine(message) : oneLineMessage(message);
  return reply
    .code(status)
    .header("content-type", "text/plain; charset=utf-8")
    .header("x-content-type-options", "nosniff")
    .send(`${text}\n`);
}

function body(request: FastifyRequest): Record<string, unknown>;
function body<T extends TSchema>(request: FastifyRequest, schema: T): Static<T>;
function body(request: FastifyRequest, schema?: TSchema): unknown {
  const decoded = decodeObjectBody(request.headers["content-type"], request.body as Buffer | undefined);
  if (schema) checkBody(schema, decoded);
  return decoded;
}

/**
 * Builds the HTTP API, wire-compatible with dstack-shim: the same paths, JSON keys, status
 * codes and plain-text error bodies. Reads are answered from memory and never wait on Docker.
 */
export function buildApi(deps: ApiDeps) {
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
    if (error instanceof TaskOperationError) return sendText(reply, 500, `internal error: ${error.message}`);
    if (typeof error.statusCode === "number" && error.statusCode >= 400 && error.statusCode < 500) {
      return sendText(reply, error.statusCode, error.message);
    }
    request.log.error({ err: error, url: request.url }, "request failed");
    return sendText(reply, 500, "internal error");
  });
  app.setNotFoundHandler((_request, reply) => sendText(reply, 404, "404 page not found"));
  // Beyond the cap Node drops a new connection at once (no answer), counted in the metric.
  app.server.maxConnections = HTTP_LIMITS.maxConnections;
  app.server.on("drop", () => deps.metrics.connectionsRefused.inc());
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

  // Open event streams end when the server closes, or its close would wait for them forever.
  const eventStreams = new EventStreams(deps.store, deps.eventStreams, {
    open: (count) => deps.metrics.eventStreams.set(count),
    refused: () => deps.metrics.eventStreamsRefused.inc(),
    cutOff: (reason) => deps.metrics.eventStreamsCutOff.inc({ reason }),
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

  const id = (request: FastifyRequest): string => (request.params as { id: string }).id;
  const startedAt = Date.now();
  const build = deps.build ?? BUILD;
  const buildView = { commit: build.commit, dirty: build.dirty, build_id: build.buildId };
  let taskList = { generation: -1, json: "" };
  const routes: ApiRoute[] = [
    {
      method: "GET",
      url: "/api/healthcheck",
      summary: "Service name and version (drives dstack's feature gates); never needs a token",
      public: true,
      response: Healthcheck,
      // `implementation`, `engine`, `storage`, `build` and `lifecycle` are taskshim extensions; dstack's client
      // ignores them. `version` stays a plain semver: dstack parses it into a tuple.
      handler: () => ({
        service: "dstack-shim",
        version: deps.version,
        implementation: "taskshim",
        engine: engineView(deps.reconciler, deps.engineInfo?.()),
        storage: storageView(deps.storage, startedAt, deps.homeHealth?.()),
        build: buildView,
        ...(deps.lifecycle ? { lifecycle: deps.lifecycle() } : {}),
      }),
    },
    {
      method: "POST",
      url: "/api/shutdown",
      summary: "Graceful (or forced) shutdown; the process exits 0 and containers keep running",
      body: ShutdownBody,
      handler: (request, reply) => {
        const b = body(request, ShutdownBody);
        deps.requestShutdown(b.force === true);
        // Its connection is not kept: the drain would otherwise hold it open, idle, for its grace.
        return sendText(reply.header("connection", "close"), 200, "");
      },
    },
    {
      method: "GET",
      url: "/api/instance/health",
      summary: "DCGM health (null: no DCGM)",
      response: InstanceHealth,
      handler: () => ({ dcgm: null }),
    },
    {
      method: "GET",
      url: "/api/instance/info",
      summary: "GPU vendor and driver of the host ({} without GPUs)",
      response: InstanceInfo,
      handler: () => {
        const first = deps.inventory.gpus[0];
        return first ? { gpu_vendor: first.vendor, gpu_driver_version: first.driverVersion } : {};
      },
    },
    {
      method: "GET",
      url: "/api/components",
      summary: "The runner and shim binaries: version and install status",
      response: Components,
      handler: async () => ({ components: await deps.components.list() }),
    },
    {
      method: "POST",
      url: "/api/components/install",
      summary: "Download and install a component in the background (409 while installing)",
      body: ComponentInstallBody,
      handler: (request, reply) => {
        const b = body(request, ComponentInstallBody);
        deps.components.install(b.name, b.url, b.sha256 ?? undefined);
        return sendText(reply, 200, "");
      },
    },
    {
      method: "GET",
      url: "/api/tasks",
      summary: "Every task's id and status",
      response: TaskList,
      handler: (_request, reply) => {
        // Serialized again only after a change: control planes poll this for every task.
        if (taskList.generation !== deps.store.generation) {
          const tasks = deps.store.list().map((t) => ({ id: t.id, status: t.status }));
          taskList = { generation: deps.store.generation, json: JSON.stringify({ tasks }) };
        }
        return sendJson(reply, taskList.json);
      },
    },
    {
      method: "POST",
      url: "/api/tasks",
      summary: "Submit a task (idempotent for the same id and config; 409 for a different config)",
      body: TaskSubmitBodySchema,
      response: TaskInfo,
      handler: async (request) => {
        const { config, auth } = parseTaskConfig(body(request));
        // Refused now rather than at container creation (`bind source path does not exist`).
        const missing =
          config.command || deps.store.get(config.id) ? undefined : deps.components.missingRunner();
        if (missing !== undefined) {
          throw new HttpError(
            400,
            `the runner binary ${missing} does not exist: install dstack-runner there (--runner-binary-path, --runner-download-url, POST /api/components/install), or give the task a command`,
          );
        }
        return taskInfo(await deps.runner.submit(config, auth));
      },
    },
    {
      method: "GET",
      url: "/api/tasks/:id",
      summary: "One task",
      response: TaskInfo,
      handler: (request, reply) => {
        const task = deps.store.get(id(request));
        return task ? sendJson(reply, taskInfoJson(task)) : sendText(reply, 404, "Not Found");
      },
    },
    {
      method: "GET",
      url: "/api/events",
      summary:
        "taskshim extension: task status changes as they happen, as newline-delimited JSON: first every task present, then each addition, status change and removal",
      handler: (_request, reply) => {
        // Beyond the cap a clear answer, and the connection is not kept: streams never take
        // the connections the rest of the API needs (event-streams.ts).
        if (!eventStreams.admit()) {
          const limit = eventStreams.limits.maxStreams;
          return sendText(
            reply.header("connection", "close").header("retry-after", "5"),
            503,
            `too many event streams: all ${limit} allowed are open (--max-event-streams); try again later`,
          );
        }
        // The stream writes to the response itself, with back-pressure and its own cut-offs.
        reply.hijack();
        eventStreams.serve(reply.raw);
        return reply;
      },
    },
    {
      method: "GET",
      url: "/api/tasks/:id/logs",
      summary:
        "taskshim extension: the last `tail` lines (default 100) of the container's output, at most its last 1 MiB (a longer line is cut at its start), as text",
      query: LogsQuery,
      handler: async (request, reply) => {
        const task = deps.store.mustGet(id(request));
        const raw = (request.query as { tail?: string }).tail ?? "100";
        const tail = Number(raw);
        if (!/^\d+$/.test(raw) || tail < 1 || tail > MAX_LOG_TAIL) {
          throw new HttpError(400, `tail must be an integer from 1 to ${MAX_LOG_TAIL}`);
        }
        const lines =
          task.containerId === undefined
            ? []
            : await deps.docker.containerLogTail(task.containerId, tail).catch((cause: unknown) => {
                // Removed (by a remove, or from outside): nothing left to read, and no fault of ours.
                if (cause instanceof DockerNotFoundError) {
                  throw new HttpError(410, `task ${task.id}: its container is gone`, { cause });
                }
                throw new TaskOperationError(`failed to read logs: ${errorMessage(cause)}`, { cause });
              });
        return reply
          .header("content-type", "text/plain; charset=utf-8")
          .send(lines.length > 0 ? `${lines.join("\n")}\n` : "");
      },
    },
    {
      method: "POST",
      url: "/api/tasks/:id/terminate",
      summary: "Terminate a task (cancel its pull or stop its container); the first reason wins",
      body: TerminateBody,
      response: TaskInfo,
      handler: async (request) => {
        const taskId = id(request);
        const { reason, message, timeout } = parseTerminate(body(request, TerminateBody));
        deps.store.mustGet(taskId);
        return taskInfo(await deps.runner.terminate(taskId, timeout, reason, message));
      },
    },
    {
      method: "POST",
      url: "/api/tasks/:id/remove",
      summary: "Remove a terminated task: its container (confirmed), resources and directory",
      handler: async (request, reply) => {
        await deps.runner.remove(id(request));
        return sendText(reply, 200, "");
      },
    },
    {
      method: "GET",
      url: "/api/openapi.json",
      summary: "This document",
      handler: (request) =>
        openApiDocument(routes, deps.version, {
          serverUrl: `${request.protocol}://${request.host}`,
          authRequired: deps.authToken !== undefined,
          schemas: {
            Healthcheck,
            ShutdownBody,
            InstanceHealth,
            InstanceInfo,
            Components,
            ComponentInstallBody,
            TaskList,
            TaskConfig: TaskSubmitBodySchema,
            TaskInfo,
            TerminateBody,
          },
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
        if (!deps.store.get(id(request))) return sendText(reply, 404, "Task not found");
        return sendText(reply, 404, "DCGM Exporter is not available");
      },
    },
  ];

  if (deps.authToken !== undefined) {
    const expected = createHash("sha256").update(deps.authToken).digest();
    const open = new Set(routes.filter((r) => r.public).map((r) => r.url));
    app.addHook("onRequest", async (request, reply) => {
      if (open.has(request.routeOptions.url ?? "")) return;
      // The scheme is case-insensitive (RFC 9110 §11.1): "bearer" is "Bearer".
      const token = /^bearer +(\S+) *$/i.exec(request.headers.authorization ?? "")?.[1] ?? "";
      // Hashing first gives equal lengths, so the comparison takes the same time for any token.
      const given = createHash("sha256").update(token).digest();
      if (token === "" || !timingSafeEqual(given, expected)) {
        // Closed after the answer: a body still on its way is not read any longer.
        await sendText(
          reply.header("www-authenticate", "Bearer").header("connection", "close"),
          401,
          "unauthorized",
        );
      }
    });
  }

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
  return app;
}

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

/** What fastify would build a route schema's validator or serializer with: no route has one. */
function noSchemaCompiler(): never {
  throw new Error("taskshim routes declare no schema: a body is checked in its route (TypeBox)");
}

const CLIENT_ERRORS: Readonly<Record<string, readonly [number, string]>> = {
  HPE_HEADER_OVERFLOW: [431, "Request Header Fields Too Large"],
  ERR_HTTP_REQUEST_TIMEOUT: [408, "Request Timeout"],
};

/**
 * Answers what Node's HTTP parser refused (fastify's own handler answers JSON): one plain-text
 * line, then the connection is closed. Nothing is written once an answer has begun.
 */
function answerClientError(error: Error & { code?: string }, socket: Socket): void {
  const answered = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage
    ?.headersSent;
  if (error.code === "ECONNRESET" || socket.destroyed || !socket.writable || answered === true) {
    socket.destroy();
    return;
  }
  // A connection the previous shim handed over is, for its client, kept alive between two
  // requests; Node times it out as a new connection whose first request is late. A 408 would
  // be read as the answer to the client's next request: it is left to the keep-alive timeout
  // (connection-handoff.ts), which closes it quietly, as it would have before the restart.
  if (error.code === "ERR_HTTP_REQUEST_TIMEOUT" && idleSinceHandoff(socket)) return;
  const [status, reason] = CLIENT_ERRORS[error.code ?? ""] ?? [400, "Bad Request"];
  const body = `${reason}\n`;
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\n` +
      `X-Content-Type-Options: nosniff\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `Connection: close\r\n\r\n${body}`,
  );
}

function firstLine(message: string): string {
  return message.split(/\r?\n/)[0] ?? "";
}

/** The errno names this platform knows (`ENOENT`, `ECONNREFUSED`…) and Node's `ERR_…` codes. */
const ERRNO_CODES = new RegExp(`\\b(?:${Object.keys(osConstants.errno).join("|")}|ERR_[A-Z0-9_]+)\\b:?`, "g");

/**
 * An error message as the API may send it: its first line, without errno codes (`ENOENT`,
 * `ERR_…`) or anything that looks like a stack frame.
 */
export function oneLineMessage(message: string): string {
  return firstLine(message)
    .replace(/\s+at\s+\S+\s+\(.*$/, "")
    .replace(ERRNO_CODES, "")
    .replace(/\s{2,}/g, " ")
    .trim();
}

/**
 * The healthcheck's `engine`: its health as the reconciler last saw it, and which engine it is
 * (`kind`, `version`) once detected. The name stays through an outage: it is the engine the shim
 * last spoke to, detected again when the engine is back.
 */
function engineView(
  reconciler: Reconciler,
  info: EngineInfo | undefined,
): { status: string; since?: string; error?: string; kind?: string; version?: string } {
  const named = info ? { kind: info.kind, version: info.version } : {};
  const health = reconciler.engineHealth();
  switch (health.state) {
    case "unknown":
      return { status: "unknown", ...named };
    case "up":
      return { status: "up", since: new Date(health.since).toISOString(), ...named };
    case "down":
      return { status: "down", since: new Date(health.since).toISOString(), error: health.error, ...named };
  }
}

/**
 * The healthcheck's `storage`: degraded while durable writes fail, and also while the home the
 * shim started on is deleted or replaced (what it writes then is lost to a restart).
 */
function storageView(
  storage: StorageHealth | undefined,
  startedAt: number,
  home: HomeHealth | undefined,
): { status: "ok" | "degraded"; since: string; error?: string } {
  const health =
    home?.status === "degraded"
      ? { state: "degraded" as const, since: home.since, error: home.error }
      : (storage?.state() ?? { state: "ok" as const, since: startedAt });
  return health.state === "ok"
    ? { status: "ok", since: new Date(health.since).toISOString() }
    : { status: "degraded", since: new Date(health.since).toISOString(), error: health.error };
}

function parseTerminate(b: Static<typeof TerminateBody>): {
  reason: TerminationReason;
  message: string;
  timeout: number;
} {
  const rawReason = b.termination_reason ?? "";
  const message = b.termination_message ?? "";
  if (CONTROL.test(rawReason)) {
    throw new HttpError(400, 'Request body contains an invalid value for the "termination_reason" field');
  }
  if (message.includes("\u0000")) {
    throw new HttpError(400, 'Request body contains an invalid value for the "termination_message" field');
  }
  // "" comes from the server's dangling-task cleanup; a terminated task still needs a valid reason.
  const reason = normalizeTerminationReason(rawReason, "terminated_by_server");
  const known = rawReason.trim().toLowerCase() === reason;
  return {
    reason,
    message: known || rawReason === "" ? message : `${rawReason}: ${message}`.trim(),
    timeout: b.timeout ?? 0,
  };
}
