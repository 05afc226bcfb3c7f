import semver from "semver";
import Type, { type Static, type TSchema } from "typebox";
import Value from "typebox/value";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";

/** The shim answered with an HTTP error status. */
export class ShimHttpError extends Error {
  override readonly name = "ShimHttpError";
  constructor(
    readonly status: number,
    readonly body: string,
    readonly path: string,
  ) {
    super(`${path}: HTTP ${status}: ${body.trim()}`);
  }
}
/** The shim could not be reached (refused, timed out). */
export class ShimUnreachableError extends Error {
  override readonly name = "ShimUnreachableError";
}
/** The shim answered 2xx with a body that does not match the contract. */
export class ShimProtocolError extends Error {
  override readonly name = "ShimProtocolError";
}

const Status = Type.Union(TASK_STATUSES.map((s) => Type.Literal(s)));
const HealthcheckSchema = Type.Object({
  service: Type.String(),
  version: Type.String(),
  implementation: Type.Optional(Type.String()),
});
const TaskListSchema = Type.Object({ tasks: Type.Array(Type.Object({ id: Type.String(), status: Status })) });
const TaskInfoSchema = Type.Object({
  id: Type.String(),
  status: Status,
  termination_reason: Type.String(),
  termination_message: Type.String(),
  ports: Type.Optional(
    Type.Union([Type.Array(Type.Object({ host: Type.Integer(), container: Type.Integer() })), Type.Null()]),
  ),
  image_pull_progress: Type.Optional(Type.Union([Type.Object({}), Type.Null()])),
  container_name: Type.Optional(Type.String()),
  container_id: Type.Optional(Type.String()),
});
const ComponentsSchema = Type.Object({
  components: Type.Array(
    Type.Object({
      name: Type.String(),
      version: Type.String(),
      status: Type.Union([
        Type.Literal("not-installed"),
        Type.Literal("installed"),
        Type.Literal("installing"),
        Type.Literal("error"),
      ]),
    }),
  ),
});

/** `GET /api/healthcheck`. */
export type Healthcheck = Static<typeof HealthcheckSchema>;
/** `GET /api/tasks/{id}` (the fields the control plane reads). */
export type ShimTaskInfo = Static<typeof TaskInfoSchema>;
/** One entry of `GET /api/components`. */
export type ShimComponent = Static<typeof ComponentsSchema>["components"][number];

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

/**
 * The feature gates of dstack's ShimClient (§7.1), plus the restart gate: every status is
 * restart-safe on a taskshim with durable state; on any other or unknown shim only `terminated`.
 */
export function negotiateFeatures(health: Healthcheck): ShimFeatures {
  const version = parseShimVersion(health.version);
  const isTaskshim = health.implementation === "taskshim";
  const durable = isTaskshim && version !== null && semver.gte(version, TASKSHIM_DURABLE_FROM);
  return {
    version,
    isTaskshim,
    apiVersion: atLeast(version, "0.18.34") ? 2 : 1,
    instanceHealth: atLeast(version, "0.19.22"),
    instanceInfo: atLeast(version, "0.20.30"),
    components: atLeast(version, "0.20.0"),
    shutdown: atLeast(version, "0.20.1"),
    restartSafeStatuses: durable ? TASK_STATUSES : ["terminated"],
  };
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
  ) {}

  private async call<S extends TSchema | undefined>(
    method: string,
    path: string,
    schema: S,
    body?: unknown,
  ): Promise<S extends TSchema ? Static<S> : string> {
    let response: Response;
    try {
      response = await fetch(new URL(path, this.baseUrl), {
        method,
        signal: AbortSignal.timeout(this.timeoutMs),
        ...(body === undefined
          ? {}
          : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
      });
    } catch (cause) {
      throw new ShimUnreachableError(`${this.baseUrl}${path}: ${(cause as Error).message}`, { cause });
    }
    const text = await response.text();
    if (!response.ok) throw new ShimHttpError(response.status, text, path);
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
    const health = await this.call("GET", "/api/healthcheck", HealthcheckSchema);
    this.features = negotiateFeatures(health);
    return health;
  }

  /** The negotiated features (a healthcheck first if none was made). */
  async negotiate(): Promise<ShimFeatures> {
    if (!this.features) await this.healthcheck();
    return this.features as ShimFeatures;
  }

  async listTasks(): Promise<{ id: string; status: TaskStatus }[]> {
    return (await this.call("GET", "/api/tasks", TaskListSchema)).tasks;
  }

  async getTask(id: string): Promise<ShimTaskInfo> {
    return this.call("GET", `/api/tasks/${encodeURIComponent(id)}`, TaskInfoSchema);
  }

  /**
   * Submits a task. A resubmit after a lost answer is answered 200 by taskshim (idempotent);
   * a 409 from an older shim for a task that exists with our id is treated as success too.
   */
  async submitTask(config: Record<string, unknown> & { id: string }): Promise<ShimTaskInfo> {
    try {
      return await this.call("POST", "/api/tasks", TaskInfoSchema, config);
    } catch (error) {
      if (error instanceof ShimHttpError && error.status === 409) {
        const existing = await this.getTask(config.id).catch(() => undefined);
        if (existing) return existing;
      }
      throw error;
    }
  }

  async terminateTask(id: string, reason = "", message = "", timeout = 10): Promise<ShimTaskInfo> {
    return this.call("POST", `/api/tasks/${encodeURIComponent(id)}/terminate`, TaskInfoSchema, {
      termination_reason: reason,
      termination_message: message,
      timeout,
    });
  }

  async removeTask(id: string): Promise<void> {
    await this.call("POST", `/api/tasks/${encodeURIComponent(id)}/remove`, undefined);
  }

  async getComponents(): Promise<ShimComponent[]> {
    return (await this.call("GET", "/api/components", ComponentsSchema)).components;
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
