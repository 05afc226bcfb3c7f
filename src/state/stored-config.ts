import type { TSchema } from "typebox";
import Value from "typebox/value";
import type { TaskConfig } from "../tasks/task-config.js";
import { TASK_FIELDS, type TaskField } from "../tasks/task-fields.js";

/*
 * The `config` of a task.json, read as a stored record, not as a request. The HTTP submit
 * validator (`parseTaskConfig`) enforces today's policy (name patterns, limits, allowed values);
 * a config that an older release accepted and stored must still restore after that policy is
 * tightened, or an upgrade would strip a running task of its config. So this reader takes the
 * same table of fields (tasks/task-fields.ts) and checks only the structure: each field has its
 * JSON type (its zero value when absent or null, as dstack-shim writes nil slices, and its
 * default), and the fields a restore cannot do without are present. It never runs a field's
 * rule. The config was validated once, at submit; the file lives in the shim's private 0700
 * task dir.
 */

/** A config that cannot be read as any version's structure; the message names the field. */
export class StoredConfigError extends Error {
  override readonly name = "StoredConfigError";
}

type Json = Record<string, unknown>;

const isRecord = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function fail(message: string): never {
  throw new StoredConfigError(message);
}

/** The keys this version knows; any other key of a stored config is kept and written back. */
export const KNOWN_CONFIG_KEYS: ReadonlySet<string> = new Set(Object.keys(TASK_FIELDS));

/** The fields a stored config holds (credentials are blanked on disk and never read back). */
const STORED = (Object.entries(TASK_FIELDS) as [string, TaskField][]).filter(
  ([, field]) => field.credential !== true,
);
/**
 * The order the fields are checked in, which decides the field a corrupt config's message names:
 * the required ones, then those that may be absent, then those with a default, then the rest
 * (the order of this reader since the first release, so a quarantine note names the same field).
 */
const rank = (field: TaskField): number =>
  field.required === true ? 0 : field.optional === true ? 1 : field.fill !== undefined ? 2 : 3;
const READ_ORDER = STORED.toSorted(([, a], [, b]) => rank(a) - rank(b));

/**
 * The checks of the JSON types a field's value may have, as TypeBox makes them (a number is
 * finite); asked directly, because `Value.Check` walks the schema at every call and a restart
 * reads every task's config (about 10 µs a config against 65 µs).
 */
const JSON_TYPES: Readonly<Record<string, (value: unknown) => boolean>> = {
  string: (v) => typeof v === "string",
  boolean: (v) => typeof v === "boolean",
  integer: (v) => Number.isInteger(v),
  number: (v) => typeof v === "number" && Number.isFinite(v),
};

/** Whether `value` is of `schema`'s JSON type. */
function isOfType(schema: TSchema, value: unknown): boolean {
  const check = JSON_TYPES[(schema as { readonly type?: string }).type ?? ""];
  return check ? check(value) : Value.Check(schema, value);
}

/** A value of `schema`'s JSON type, or its zero value when absent or null. */
function scalar(schema: TSchema, value: unknown, zero: unknown, path: string): unknown {
  if (value === undefined || value === null) return zero;
  if (!isOfType(schema, value)) fail(`${path} has the wrong type`);
  return value;
}

/**
 * One field by its JSON type alone. A list's objects keep every other key they hold (a newer
 * release's field is written back unchanged); a map or a list of values must hold values of
 * its item type.
 */
function storedValue(name: string, field: TaskField, value: unknown): unknown {
  if (value === undefined || value === null) {
    if (field.optional === true) return undefined;
    return Array.isArray(field.zero) ? [] : field.zero;
  }
  const schema = field.schema as TSchema & {
    readonly type?: string;
    readonly items?: TSchema & { readonly type?: string };
    readonly patternProperties?: Readonly<Record<string, TSchema & { readonly type?: string }>>;
  };
  const items = field.items;
  if (items !== undefined) {
    if (!Array.isArray(value)) fail(`${name} has the wrong type`);
    return value.map((entry: unknown, i) => {
      if (!isRecord(entry)) fail(`${name}[${i}] is not an object`);
      const out: Json = { ...entry };
      for (const [key, item] of Object.entries(items)) {
        if (item.dropped !== true)
          out[key] = scalar(item.schema, entry[key], item.zero, `${name}[${i}].${key}`);
      }
      return out;
    });
  }
  const element = schema.items ?? Object.values(schema.patternProperties ?? {})[0];
  if (element === undefined) return scalar(schema, value, field.zero, name);
  const list: readonly unknown[] | undefined = Array.isArray(value) ? value : undefined;
  const map = isRecord(value) ? value : undefined;
  const values = schema.type === "array" ? list : map && Object.values(map);
  if (values === undefined) fail(`${name} has the wrong type`);
  if (!values.every((v) => isOfType(element, v))) fail(`${name} holds a value that is not a ${element.type}`);
  return list ? [...list] : { ...map };
}

/**
 * Reads a stored config by its structure alone, with the zero values and defaults the submit
 * applies (`container_user` "root", `network_mode` "host"). Throws `StoredConfigError`.
 */
export function decodeStoredConfig(raw: unknown): TaskConfig {
  if (!isRecord(raw)) fail("config is not an object");
  const values = new Map<string, unknown>();
  for (const [name, field] of READ_ORDER) {
    const value = storedValue(name, field, raw[name]);
    if (field.required === true && value === "") fail(`config has no ${name}`);
    values.set(name, value);
  }
  const config: Json = {};
  for (const [name, field] of STORED) {
    const value = values.get(name);
    const filled = value !== undefined && field.fill ? field.fill(value as never) : value;
    if (filled !== undefined) config[name] = filled;
  }
  return config as TaskConfig;
}

/** The keys of a stored config (or of a whole file) that this version does not know. */
export function unknownKeys(raw: Json, known: ReadonlySet<string>): Json | undefined {
  const extra = Object.fromEntries(Object.entries(raw).filter(([key]) => !known.has(key)));
  return Object.keys(extra).length > 0 ? extra : undefined;
}
