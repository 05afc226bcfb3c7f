import Type, { type Static, type TSchema } from "typebox";
import { SHIM_PHASES } from "../lifecycle/shim-lifecycle.js";
import { TaskSubmitBodySchema } from "../tasks/task-fields.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { open } from "./tolerant.js";

/*
 * The HTTP wire format: the request and answer schemas of every route. The server validates
 * request bodies with them and builds the OpenAPI document from them, so the document cannot
 * drift from what the server accepts; clients (control/shim-client.ts) check answers against the
 * tolerant views derived from them (client-views.ts). Values marked `open` may gain members in a
 * later release: the server sends and documents only these, a client accepts any string there.
 */

const nullable = <T extends TSchema>(schema: T) => Type.Optional(Type.Union([schema, Type.Null()]));
// A union built from an array loses its literal types in Static (it becomes never); the schema
// still checks the values, Unsafe only restores the type (and adds nothing to the JSON).
const Status = Type.Unsafe<TaskStatus>(Type.Union(TASK_STATUSES.map((s) => Type.Literal(s))));

/**
 * `POST /api/tasks` (dstack-shim's TaskConfig). Its schema is derived from the table of a task's
 * fields (`tasks/task-fields.ts`, with their zero values and rules, in the domain, which imports
 * nothing); it is part of the wire format all the same.
 */
export const SubmitBody = TaskSubmitBodySchema;

/** The longest stop timeout a terminate may ask for (a day). */
export const MAX_STOP_TIMEOUT_S = 24 * 60 * 60;

export const ShutdownBody = Type.Object({ force: nullable(Type.Boolean()) });
export const TerminateBody = Type.Object({
  termination_reason: nullable(Type.String({ maxLength: 128 })),
  termination_message: nullable(Type.String({ maxLength: 65_536 })),
  timeout: nullable(Type.Integer({ minimum: 0, maximum: MAX_STOP_TIMEOUT_S })),
});
export const ComponentInstallBody = Type.Object({
  name: nullable(Type.String()),
  url: nullable(Type.String()),
  sha256: nullable(Type.String({ pattern: "^[0-9a-fA-F]{64}$" })),
});

export const LogsQuery = Type.Object({ tail: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000 })) });

/** `GET /api/healthcheck`: dstack's `service` and `version`, then taskshim's extensions. */
export const Healthcheck = Type.Object({
  service: open(Type.Literal("dstack-shim")),
  version: Type.String(),
  implementation: open(Type.Literal("taskshim")),
  engine: Type.Object({
    status: open(
      Type.Union(
        [Type.Literal("up"), Type.Literal("down"), Type.Literal("unknown"), Type.Literal("mismatch")],
        {
          description: "mismatch: the engine answering is not the one this home's containers live on",
        },
      ),
    ),
    since: Type.Optional(Type.String()),
    error: Type.Optional(Type.String()),
    kind: Type.Optional(
      open(
        Type.Union([Type.Literal("docker"), Type.Literal("podman")], {
          description: "which engine the shim drives, from its GET /version; absent until first known",
        }),
      ),
    ),
    version: Type.Optional(Type.String({ description: "the engine's own version (not its API version)" })),
  }),
  /** Whether the home takes durable writes; `error` only while degraded. */
  storage: Type.Object({
    status: open(Type.Union([Type.Literal("ok"), Type.Literal("degraded")])),
    since: Type.String(),
    error: Type.Optional(Type.String()),
  }),
  /** The shim process's phase: serving while it answers, draining once a shutdown began. */
  lifecycle: Type.Optional(
    Type.Object({
      phase: open(
        Type.Union(
          SHIM_PHASES.map((phase) => Type.Literal(phase)),
          { description: "starting, restoring, serving, draining, stopped or failed" },
        ),
      ),
      since: Type.String({ description: "when the shim entered this phase (ISO 8601)" }),
    }),
  ),
  /**
   * The last rollback of the `taskshim supervise` that started this shim: a new binary did not
   * serve, and the previous one was put back and runs now. Absent when there was none.
   */
  rollback: Type.Optional(
    Type.Object({
      at: Type.String({ description: "when the previous binary was put back (ISO 8601)" }),
      reason: Type.String({ description: "why, in one line (exited before serving, did not serve in time)" }),
      binary: Type.String({ description: "the path the failed binary was replaced at" }),
    }),
  ),
  /** Which build answers: `version` alone cannot tell two builds of one release apart. */
  build: Type.Object({
    commit: Type.String({ description: "the git commit it was built from, or unknown" }),
    dirty: Type.Boolean({ description: "whether tracked files differed from commit at build time" }),
    build_id: Type.String({
      description: "content hash of the build (dev when run unbundled); equal ids, same code",
    }),
  }),
});
export const PullProgress = Type.Object({
  downloaded_bytes: Type.Integer(),
  extracted_bytes: Type.Integer(),
  total_bytes: Type.Integer(),
  is_total_bytes_final: Type.Boolean(),
});
/** `GET /api/tasks/{id}` and the other task answers (dstack-shim's TaskInfoResponse). */
export const TaskInfo = Type.Object({
  id: Type.String(),
  status: Status,
  termination_reason: Type.String(),
  termination_message: Type.String(),
  ports: Type.Union([
    Type.Array(Type.Object({ host: Type.Integer(), container: Type.Integer() })),
    Type.Null(),
  ]),
  image_pull_progress: Type.Union([PullProgress, Type.Null()]),
  container_name: Type.String(),
  container_id: Type.String(),
  /** The key's spelling is dstack-shim's (sic). */
  gpus_ids: Type.Union([Type.Array(Type.String()), Type.Null()]),
  name: Type.String({ description: "taskshim extension: the task's name, as submitted" }),
  image_name: Type.String({ description: "taskshim extension: the task's image, as submitted" }),
  exit_code: Type.Union([Type.Integer(), Type.Null()], {
    description: "taskshim extension: the container's exit code; null until known, or when it never can be",
  }),
  created_at: Type.Union([Type.String({ format: "date-time" }), Type.Null()], {
    description: "taskshim extension: when the task was submitted (null: restored from its container alone)",
  }),
  started_at: Type.Union([Type.String({ format: "date-time" }), Type.Null()], {
    description: "taskshim extension: when the task became running",
  }),
  finished_at: Type.Union([Type.String({ format: "date-time" }), Type.Null()], {
    description: "taskshim extension: when the task became terminated (the container's own finish time)",
  }),
  held: Type.Optional(
    Type.Object(
      {
        kind: open(
          Type.Union([
            Type.Literal("newer-format"),
            Type.Literal("newer-status"),
            Type.Literal("unquarantined"),
          ]),
        ),
        message: Type.String({ description: "why, in the words a refused request is answered with (409)" }),
        status: Type.Optional(
          Type.String({
            description: "the status its task.json holds, as written, when `status` cannot carry it",
          }),
        ),
      },
      {
        description:
          "taskshim extension, present only for a task this release leaves alone: a newer taskshim's (a task.json of a newer version, or with a status this release does not know), or one whose unreadable task.json could not be moved to the quarantine. It is shown read-only; a submit, terminate or remove of its id answers 409.",
      },
    ),
  ),
});
export const TaskList = Type.Object({
  tasks: Type.Array(Type.Object({ id: Type.String(), status: Status })),
});
export const Components = Type.Object({
  components: Type.Array(
    Type.Object({
      name: open(Type.Union([Type.Literal("dstack-runner"), Type.Literal("dstack-shim")])),
      version: Type.String(),
      status: Type.Union([
        Type.Literal("not-installed"),
        Type.Literal("installed"),
        Type.Literal("installing"),
        Type.Literal("error"),
      ]),
      build_id: Type.Optional(
        Type.String({
          description:
            "taskshim extension, dstack-shim only: the build_id that a taskshim binary's `version --json` prints",
        }),
      ),
      error: Type.Optional(
        Type.String({
          description:
            "taskshim extension: why the last install failed; status and version then describe the binary still in place",
        }),
      ),
    }),
  ),
});
export const InstanceInfo = Type.Object({
  gpu_vendor: Type.Optional(
    Type.String({
      description:
        "dstack's vendor string of the host's GPUs: nvidia, amd, intel (Gaudi) or tenstorrent; open: a later release may add one",
    }),
  ),
  gpu_driver_version: Type.Optional(
    Type.String({ description: "the first GPU's driver version; empty when unknown" }),
  ),
});
/** DCGM's health results: pass 0, warn 10, fail 20 (dstack's server accepts no other). */
const DcgmHealthResult = Type.Union([Type.Literal(0), Type.Literal(10), Type.Literal(20)]);
/** One DCGM health incident, flattened as dstack-shim sends it. */
export const DcgmHealthIncident = Type.Object({
  system: Type.Integer({
    description: "the health watch system (DCGM_HEALTH_WATCH_* bit: 1 PCIe, 16 memory…)",
  }),
  health: DcgmHealthResult,
  error_message: Type.String(),
  error_code: Type.Integer({ description: "DCGM's error code; 0 when the source does not report it" }),
  entity_group_id: Type.Integer({ description: "DCGM's entity group (1: GPU)" }),
  entity_id: Type.Integer(),
});
/** GPU health from DCGM, or null: no DCGM on the host, or no fresh answer from it. */
export const InstanceHealth = Type.Object({
  dcgm: Type.Union([
    Type.Object({ overall_health: DcgmHealthResult, incidents: Type.Array(DcgmHealthIncident) }),
    Type.Null(),
  ]),
});

/**
 * One line of `GET /api/events` (taskshim extension, newline-delimited JSON). `present`: a task of
 * the snapshot that opens the stream; then `added`, `changed` or `removed`.
 */
export const TaskEvent = Type.Object({
  time: Type.String(),
  kind: Type.Union([
    Type.Literal("present"),
    Type.Literal("added"),
    Type.Literal("changed"),
    Type.Literal("removed"),
  ]),
  id: Type.String(),
  from: Type.Union([Status, Type.Null()]),
  to: Type.Union([Status, Type.Null()]),
  /** Set once the task is terminated. */
  termination_reason: Type.Optional(Type.String()),
  exit_code: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
});

/** The shared schemas of the OpenAPI document, by name, in the document's order. */
export const OPENAPI_SCHEMAS: Readonly<Record<string, TSchema>> = {
  Healthcheck,
  ShutdownBody,
  InstanceHealth,
  InstanceInfo,
  Components,
  ComponentInstallBody,
  TaskList,
  TaskConfig: SubmitBody,
  TaskInfo,
  TerminateBody,
};

/** A value the server builds and never changes (it may hand out the task's own arrays). */
type Frozen<T> = T extends readonly (infer E)[]
  ? readonly Frozen<E>[]
  : T extends object
    ? { readonly [K in keyof T]: Frozen<T[K]> }
    : T;
/** A task answer as the server builds it. */
export type TaskInfoAnswer = Frozen<Static<typeof TaskInfo>>;
/** An event of the stream as the server builds it. */
export type TaskEventAnswer = Frozen<Static<typeof TaskEvent>>;
