import { Compile, type Validator } from "typebox/compile";
import Value from "typebox/value";
import {
  InvalidTaskConfigError,
  TASK_FIELDS,
  TaskSubmitBodySchema,
  type TaskConfig,
  type TaskField,
  type TaskFieldName,
} from "./task-fields.js";

// What the readers of a config (the runner, the state, the API) ask about, beside the parser.
export {
  InvalidTaskConfigError,
  isValidTaskId,
  isValidTaskName,
  isValidVolumeName,
  type TaskConfig,
} from "./task-fields.js";

/*
 * The submit body (dstack-shim `TaskConfig`), decoded with Go's forgiving semantics — unknown
 * fields are ignored, missing fields and JSON null take the zero value — and then validated
 * strictly, because every field ends up in a path, a container spec or a shell command. The
 * fields, their zero values and their rules are the table of tasks/task-fields.ts; this is the
 * order they are applied in.
 */

/** Registry credentials: kept in memory only, never in task.json or logs. */
export interface RegistryAuth {
  readonly username: string;
  readonly password: string;
}

const FIELDS = Object.entries(TASK_FIELDS) as readonly (readonly [TaskFieldName, TaskField])[];
/** The fields with a rule, in the order the submit checks them (a stable sort keeps the table's order). */
const CHECKED = FIELDS.filter(([, field]) => field.rule !== undefined).toSorted(
  ([, a], [, b]) => (a.order ?? Number.MAX_SAFE_INTEGER) - (b.order ?? Number.MAX_SAFE_INTEGER),
);

let compiledBody: Validator | undefined;

/**
 * The body schema compiled to a JavaScript check on first use (5 ms once): 200 checks take
 * 0.6 ms against 56 ms with `Value.Check`, which walks the schema each time.
 */
function bodyValidator(): Validator {
  return (compiledBody ??= Compile(TaskSubmitBodySchema));
}

/** The first schema error of a body, in the style of dstack-shim's decoder. */
export function describeBodyError(body: unknown): string | undefined {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return "Request body must be a JSON object";
  }
  // Check first: Errors walks the whole body, ~10x slower.
  if (bodyValidator().Check(body)) return undefined;
  const first = Value.Errors(TaskSubmitBodySchema, body).find((e) => e.instancePath !== "");
  const field = (first?.instancePath ?? "").split("/").filter(Boolean).join(".");
  return `Request body contains an invalid value for the "${field}" field`;
}

/**
 * A field of a well-shaped body with Go's zero values: absent or null reads as the zero (an
 * optional field stays absent), and so does every field of a list's objects; the objects keep
 * only the fields the config has.
 */
function zeroFilled(field: TaskField, value: unknown): unknown {
  if (value === undefined || value === null) return field.optional === true ? undefined : field.zero;
  const items = field.items;
  if (items === undefined) return value;
  const kept = Object.entries(items).filter(([, item]) => item.dropped !== true);
  return (value as readonly Readonly<Record<string, unknown>>[]).map((entry) =>
    Object.fromEntries(kept.map(([name, item]) => [name, entry[name] ?? item.zero])),
  );
}

/**
 * Turns a decoded submit body into a validated config and the registry credentials.
 * Throws `InvalidTaskConfigError` with the wire's messages (`empty id`, …) or a precise one.
 */
export function parseTaskConfig(body: unknown): { config: TaskConfig; auth: RegistryAuth } {
  const shapeError = describeBodyError(body);
  if (shapeError !== undefined) throw new InvalidTaskConfigError(shapeError);
  const raw = body as Readonly<Record<string, unknown>>;
  const values = new Map(FIELDS.map(([name, field]) => [name, zeroFilled(field, raw[name])]));
  for (const [name, field] of FIELDS) {
    if (field.required === true && values.get(name) === "") throw new InvalidTaskConfigError(`empty ${name}`);
  }
  for (const [name, field] of CHECKED) {
    const value = values.get(name);
    if (value !== undefined) values.set(name, field.rule?.(value as never));
  }
  const config: Record<string, unknown> = {};
  for (const [name, field] of FIELDS) {
    const value = values.get(name);
    if (field.credential === true || value === undefined) continue;
    config[name] = field.fill ? field.fill(value as never) : value;
  }
  return {
    config: config as TaskConfig,
    auth: {
      username: values.get("registry_username") as string,
      password: values.get("registry_password") as string,
    },
  };
}

/** Stable comparison of two configs (for idempotent submit): key order does not matter. */
export function sameTaskConfig(a: TaskConfig, b: TaskConfig): boolean {
  return stableJson(a) === stableJson(b);
}

function stableJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(
          Object.entries(v as Record<string, unknown>).sort(([x], [y]) => x.localeCompare(y)),
        )
      : v,
  );
}
