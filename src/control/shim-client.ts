import semver from "semver";
import type { Static, TSchema } from "typebox";
import Value from "typebox/value";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import {
  ComponentsView,
  HealthcheckView,
  InstanceInfoView,
  TaskEventView,
  TaskInfoView,
  TaskListView,
  type ComponentReading,
  type HealthcheckReading,
  type InstanceInfoReading,
  type TaskEventReading,
  type TaskInfoReading,
} from "../wire/client-views.js";
import { errorMessage } from "../errors/error-message.js";

/** The shim answered with an HTTP error status. */
export class ShimHttpError extends Error {
  override readonly name = "ShimHttpError";
  constructor(
    readonly status: number,
    readonly body: string,
    readonly path: string,
    readonly method = "GET",
  ) {
    super(`${method} ${path}: HTTP ${status}: ${body.trim()}`);
  }
}
/**
 * A task id that no request path can carry: empty, `.` or `..`. A URL resolves `.` and `..` path
 * segments away, percent-encoded or not (`/api/tasks/..` is `/api/`), so the request would reach
 * another route; no such request is sent.
 */
export class UnaddressableTaskIdError extends Error {
  override readonly name = "UnaddressableTaskIdError";
}
/** The shim could not be reached (refused, timed out). */
export class ShimUnreachableError extends Error {
  override readonly name = "ShimUnreachableError";
}
/** The shim answered 2xx with a body that does not match the contract. */
export class ShimProtocolError extends Error {
  override readonly name = "ShimProtocolError";
}
/**
 * An answer (or one line of the event stream) was larger than a client reads: the rest was not
 * read and the connection was dropped, so an endless or huge body never exhausts the heap.
 */
export class ShimAnswerTooLargeError extends Error {
  override readonly name = "ShimAnswerTooLargeError";
  constructor(
    readonly url: string,
    readonly limitBytes: number,
  ) {
    super(`answer from ${url} exceeds ${formatMiB(limitBytes)}`);
  }
}

/**
 * The most a {@link ShimClient} reads of one answer. The largest a shim sends is a logs tail (at
 * most 1 MiB of output plus one newline per line) or a task list of a few thousand tasks; an
 * answer past this is not a shim's, and reading it whole cost gigabytes (a body that never ends).
 */
export const MAX_ANSWER_BYTES = 16 * 1024 * 1024;
/** The most one line of `GET /api/events` may hold (an event is a few hundred bytes). */
export const MAX_EVENT_LINE_BYTES = 1024 * 1024;

const formatMiB = (bytes: number): string => `${Math.round((bytes / 1024 / 1024) * 100) / 100} MiB`;

/**
 * Reads an answer's body as text, at most `limit` bytes: past it the body is cancelled (the
 * connection dropped) and {@link ShimAnswerTooLargeError} thrown. Network errors and the request's
 * deadline surface as the body stream's own errors.
 */
export async function readLimitedText(
  response: Response,
  url: string,
  limit = MAX_ANSWER_BYTES,
): Promise<string> {
  if (!response.body) return "";
  const reader: ReadableStreamDefaultReader<Uint8Array> = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > limit) throw new ShimAnswerTooLargeError(url, limit);
      chunks.push(value);
    }
  } catch (error) {
    await reader.cancel().catch(() => undefined);
    throw error;
  }
  return Buffer.concat(chunks, size).toString("utf8");
}

/** `GET /api/healthcheck`. */
export type Healthcheck = HealthcheckReading;
/** `GET /api/tasks/{id}` (the fields the control plane reads). */
export type ShimTaskInfo = TaskInfoReading;
/** One line of the taskshim extension `GET /api/events`. */
export type ShimTaskEvent = TaskEventReading;
/** One entry of `GET /api/components`. */
export type ShimComponent = ComponentReading;
/** `GET /api/instance/info`: the first GPU's vendor and driver, or `{}` without GPUs. */
export type ShimInstanceInfo = InstanceInfoReading;
/** `image_pull_progress` of a task. */
export type ShimPullProgress = NonNullable<ShimTaskInfo["image_pull_progress"]>;

/** Options of a {@link ShimClient}. */
export interface ShimClientOptions {
  /** Sent as `Authorization: Bearer <token>` (shims started with `--auth-token-file`). */
  readonly authToken?: string;
}

/** What a shim supports, negotiated from its healthcheck version as dstack's server does. */
export interface ShimFeatures {
  /** The parsed final version, or null for a dev/prerelease build (treated as newest). */
  readonly version: string | null;
  readonly isTaskshim: boolean;
  readonly apiVersion: 1 | 2;
  readonly instanceHealth: boolean;
  readonly instanceInfo: boolean;
  readonly components: boolean;
  readonly shutdown: boolean;
  /** Statuses in which a task survives a shim restart. */
  readonly restartSafeStatuses: readonly TaskStatus[];
}

/** dstack's `_parse_version`: a final X.Y.Z, else null ("latest"). */
export function parseShimVersion(version: string): string | null {
  const parsed = semver.valid(version);
  return parsed !== null && semver.prerelease(parsed) === null ? parsed : null;
}

const atLeast = (version: string | null, min: string): boolean =>
  version === null || semver.gte(version, min);

/** The first taskshim version whose every status survives a restart (durable task.json). */
export const TASKSHIM_DURABLE_FROM = "1.0.0";
/** The first dstack-shim version whose running tasks survive a restart (dstack #4224). */
export const SHIM_RUNNING_RESTART_SAFE_FROM = "0.21.3";

/**
 * The restart gate as dstack reads it, on the version alone: a non-final version ("latest", a
 * pre-release) is the newest build, so it gets the newest rules; taskshim ≥ 1.0.0 keeps every
 * status across a restart; dstack-shim ≥ 0.21.3 keeps `running` (dstack #4224); anything older
 * only `terminated`. The `implementation` field is a taskshim extension dstack does not read, so
 * the gate ignores it.
 */
function restartSafeStatuses(version: string | null): readonly TaskStatus[] {
  if (version === null || semver.gte(version, TASKSHIM_DURABLE_FROM)) return TASK_STATUSES;
  if (semver.gte(version, SHIM_RUNNING_RESTART_SAFE_FROM)) return ["terminated", "running"];
  return ["terminated"];
}

/** The version gates of the dstack server's ShimClient (see `ShimFeatures`), plus the restart gate. */
export function negotiateFeatures(health: Healthcheck): ShimFeatures {
  const version = parseShimVersion(health.version);
  return {
    version,
    isTaskshim: health.implementation === "taskshim",
    apiVersion: atLeast(version, "0.18.34") ? 2 : 1,
    instanceHealth: atLeast(version, "0.19.22"),
    instanceInfo: atLeast(version, "0.20.30"),
    components: atLeast(version, "0.20.0"),
    shutdown: atLeast(version, "0.20.1"),
    restartSafeStatuses: restartSafeStatuses(version),
  };
}

/**
 * Why a fetch failed, in one line: undici reports every network failure as "fetch failed" and
 * keeps the useful part (`connect ECONNREFUSED 127.0.0.1:10998`) in `cause`.
 */
function fetchFailure(error: unknown): string {
  if (error instanceof Error && error.name === "TimeoutError") return "no answer within the deadline";
  const cause = (error as { cause?: unknown } | undefined)?.cause;
  const detail = cause instanceof Error ? cause.message : undefined;
  return detail ?? errorMessage(error);
}

/**
 * `/api/tasks/{id}` and what follows it, the id percent-encoded whole (a `/`, `?`, `#` or `%` in
 * it stays inside its path segment).
 *
 * @throws UnaddressableTaskIdError for an id no path segment can carry.
 */
export function taskPath(id: string, rest = ""): string {
  if (id === "" || id === "." || id === "..") {
    throw new UnaddressableTaskIdError(
      `task id ${JSON.stringify(id)} cannot be sent in a request path (a URL resolves it away)`,
    );
  }
  return `/api/tasks/${encodeURIComponent(id)}${rest}`;
}

/**
 * The control plane's typed client of one shim: every response is validated against the wire
 * contract, every call has a deadline (9 s, dstack's REQUEST_TIMEOUT).
 */
export class ShimClient {
  private features: ShimFeatures | undefined;

  constructor(
    readonly baseUrl: string,
    private readonly timeoutMs = 9_000,
    private readonly options: ShimClientOptions = {},
  ) {}

  private async call<S extends TSchema | undefined>(
    method: string,
    path: string,
    schema: S,
    body?: unknown,
    timeoutMs = this.timeoutMs,
  ): Promise<S extends TSchema ? Static<S> : string> {
    let response: Response;
    const headers: Record<string, string> = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.options.authToken !== undefined) headers.authorization = `Bearer ${this.options.authToken}`;
    let text: string;
    const url = new URL(path, this.baseUrl);
    try {
      response = await fetch(url, {
        method,
        signal: AbortSignal.timeout(timeoutMs),
        headers,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      text = await readLimitedText(response, url.href);
    } catch (cause) {
      if (cause instanceof ShimAnswerTooLargeError) throw cause;
      throw new ShimUnreachableError(`${this.baseUrl}${path}: ${fetchFailure(cause)}`, { cause });
    }
    if (!response.ok) throw new ShimHttpError(response.status, text, path, method);
    if (schema === undefined) return text as never;
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (cause) {
      throw new ShimProtocolError(`${path}: response is not JSON`, { cause });
    }
    if (!Value.Check(schema, json)) {
      const first = Value.Errors(schema, json)[0];
      throw new ShimProtocolError(
        `${path}: unexpected response: ${first?.instancePath ?? ""} ${first?.message ?? ""}`,
      );
    }
    // tsc cannot narrow the conditional return type (eslint thinks it can); Value.Check proved it.
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-assertion
    return json as S extends TSchema ? Static<S> : string;
  }

  /** `GET /api/healthcheck`, and the features it implies (cached). */
  async healthcheck(): Promise<Healthcheck> {
    const health = await this.call("GET", "/api/healthcheck", HealthcheckView);
    this.features = negotiateFeatures(health);
    return health;
  }

  /** The negotiated features (a healthcheck first if none was made). */
  async negotiate(): Promise<ShimFeatures> {
    if (!this.features) await this.healthcheck();
    return this.features as ShimFeatures;
  }

  async listTasks(): Promise<{ id: string; status: TaskStatus }[]> {
    return (await this.call("GET", "/api/tasks", TaskListView)).tasks;
  }

  async getTask(id: string): Promise<ShimTaskInfo> {
    return this.call("GET", taskPath(id), TaskInfoView);
  }

  /**
   * Submits a task. A resubmit after a lost answer is answered 200 by taskshim (idempotent);
   * a 409 from an older shim for a task that exists with our id is treated as success too,
   * unless `adoptExisting` is false (a person reusing an id wants to hear about the conflict).
   */
  async submitTask(
    config: Record<string, unknown> & { id: string },
    options: { readonly adoptExisting?: boolean } = {},
  ): Promise<ShimTaskInfo> {
    try {
      return await this.call("POST", "/api/tasks", TaskInfoView, config);
    } catch (error) {
      if (error instanceof ShimHttpError && error.status === 409 && options.adoptExisting !== false) {
        const existing = await this.getTask(config.id).catch(() => undefined);
        if (existing) return existing;
      }
      throw error;
    }
  }

  /**
   * `POST /api/tasks/{id}/terminate`. The shim answers once the container has stopped, which
   * can take the whole grace period (`timeout` seconds) before the SIGKILL: the request's
   * deadline is that grace plus the usual deadline.
   */
  async terminateTask(id: string, reason = "", message = "", timeout = 10): Promise<ShimTaskInfo> {
    return this.call(
      "POST",
      taskPath(id, "/terminate"),
      TaskInfoView,
      { termination_reason: reason, termination_message: message, timeout },
      timeout * 1000 + this.timeoutMs,
    );
  }

  async removeTask(id: string): Promise<void> {
    await this.call("POST", taskPath(id, "/remove"), undefined);
  }

  /** taskshim extension `GET /api/tasks/{id}/logs?tail=N`: the container's last lines, as text. */
  async logs(id: string, tail = 100): Promise<string> {
    return this.call("GET", taskPath(id, `/logs?tail=${tail}`), undefined);
  }

  /**
   * taskshim extension `GET /api/events`: the tasks present, then every change as it happens,
   * until `signal` aborts (the generator then just returns) or the connection ends (the
   * generator returns; a dropped connection throws {@link ShimUnreachableError}). The usual
   * deadline covers the wait for the answer's headers only.
   */
  async *events(signal: AbortSignal): AsyncGenerator<ShimTaskEvent> {
    const path = "/api/events";
    const headers: Record<string, string> = {};
    if (this.options.authToken !== undefined) headers.authorization = `Bearer ${this.options.authToken}`;
    // One controller for the whole stream, aborted by the caller's signal or the connect
    // deadline: the stream lives as long as the caller wants, so it holds its own signal.
    const stream = new AbortController();
    const onStop = (): void => stream.abort(signal.reason);
    signal.addEventListener("abort", onStop, { once: true });
    if (signal.aborted) onStop();
    const deadline = new DOMException("deadline", "TimeoutError");
    const timer = setTimeout(() => stream.abort(deadline), this.timeoutMs);
    let response: Response;
    try {
      response = await fetch(new URL(path, this.baseUrl), { signal: stream.signal, headers });
    } catch (cause) {
      signal.removeEventListener("abort", onStop);
      if (signal.aborted) return;
      throw new ShimUnreachableError(
        `${this.baseUrl}${path}: ${fetchFailure(stream.signal.aborted ? deadline : cause)}`,
        { cause },
      );
    } finally {
      clearTimeout(timer);
    }
    if (!response.ok) {
      const text = await readLimitedText(response, `${this.baseUrl}${path}`).catch(() => "");
      throw new ShimHttpError(response.status, text, path);
    }
    if (!response.body) return;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        let chunk: Awaited<ReturnType<typeof reader.read>>;
        try {
          chunk = await reader.read();
        } catch (cause) {
          if (signal.aborted) return;
          throw new ShimUnreachableError(`${this.baseUrl}${path}: ${fetchFailure(cause)}`, { cause });
        }
        if (chunk.done) return;
        buffer += chunk.value;
        for (let end = buffer.indexOf("\n"); end !== -1; end = buffer.indexOf("\n")) {
          const line = buffer.slice(0, end).trim();
          buffer = buffer.slice(end + 1);
          if (line === "") continue;
          let json: unknown;
          try {
            json = JSON.parse(line);
          } catch (cause) {
            throw new ShimProtocolError(`${path}: a line is not JSON`, { cause });
          }
          if (!Value.Check(TaskEventView, json)) throw new ShimProtocolError(`${path}: unexpected event`);
          yield json;
        }
        // A line that never ends would grow without bound: not an event stream of a shim.
        if (buffer.length > MAX_EVENT_LINE_BYTES) {
          throw new ShimAnswerTooLargeError(`${this.baseUrl}${path}`, MAX_EVENT_LINE_BYTES);
        }
      }
    } finally {
      signal.removeEventListener("abort", onStop);
      await reader.cancel().catch(() => undefined);
    }
  }

  /** `GET /api/instance/info`. */
  async instanceInfo(): Promise<ShimInstanceInfo> {
    return this.call("GET", "/api/instance/info", InstanceInfoView);
  }

  /** `GET /metrics`: the Prometheus text exposition. */
  async metrics(): Promise<string> {
    return this.call("GET", "/metrics", undefined);
  }

  async getComponents(): Promise<ShimComponent[]> {
    return (await this.call("GET", "/api/components", ComponentsView)).components;
  }

  async installComponent(name: "dstack-runner" | "dstack-shim", url: string, sha256?: string): Promise<void> {
    await this.call("POST", "/api/components/install", undefined, {
      name,
      url,
      ...(sha256 ? { sha256 } : {}),
    });
  }

  async shutdown(force: boolean): Promise<void> {
    await this.call("POST", "/api/shutdown", undefined, { force });
  }

  /** dstack's `is_safe_to_restart`: API v2 and every task in a restart-safe status. */
  async isSafeToRestart(): Promise<{ safe: boolean; blocking: { id: string; status: TaskStatus }[] }> {
    const features = await this.negotiate();
    if (features.apiVersion !== 2) return { safe: false, blocking: [] };
    const blocking = (await this.listTasks()).filter((t) => !features.restartSafeStatuses.includes(t.status));
    return { safe: blocking.length === 0, blocking };
  }
}
