import { posix } from "node:path";
import Type, { type Static, type TArray, type TNull, type TObject, type TSchema, type TUnion } from "typebox";
import { parseImageReference } from "./image-ref.js";
import { canonicalizePublicKey } from "./ssh-public-key.js";
import { errorMessage } from "../errors/error-message.js";

/*
 * A task's fields, each spelled out once: its JSON type (TypeBox), Go's zero value, and the
 * submit's rule. Everything else is derived from this table: the wire schema of `POST /api/tasks`
 * and the OpenAPI document (`TaskSubmitBodySchema`), the `TaskConfig` type, the submit parser
 * (`parseTaskConfig`, tasks/task-config.ts), the tolerant reader of a stored config
 * (`decodeStoredConfig`, state/stored-config.ts) and the CLI's flag checks (cli/submit-body.ts).
 *
 * Two readers, one table, because a config is read twice with different trust: a submit is a
 * request, checked against today's rules (every value ends up in a path, a container spec or a
 * shell command); a task.json is a record an older release accepted, read by its types alone so
 * that a rule tightened later never strips a running task of its config.
 */

/** A submit body that cannot become a task; the message is safe to show to the client. */
export class InvalidTaskConfigError extends Error {
  override readonly name = "InvalidTaskConfigError";
}

function fail(message: string): never {
  throw new InvalidTaskConfigError(message);
}

const MAX_LIST = 256;
const MAX_GPU = 1024;
const MAX_CPU = 65_536;
const MAX_BYTES = 2 ** 52;
/** Task ids become labels, URL segments and state-file fields: keep them plain. */
const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
/** Task names become Docker container names and directory names. */
const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$/;
const VOLUME_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const CONTAINER_USER_PATTERN = /^[A-Za-z0-9_.-]{1,64}(:[A-Za-z0-9_.-]{1,64})?$/;
const USER_PATTERN = /^[A-Za-z_][A-Za-z0-9_.-]{0,31}$/;
const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_ENV_NAME = 256;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/** The network modes a task may ask for; an empty one is dstack-shim's default, host. */
export const NETWORK_MODES = ["host", "bridge"] as const;

/** Whether `id` is a task id the submit accepts (it then works as a label, URL segment and file field). */
export function isValidTaskId(id: string): boolean {
  return ID_PATTERN.test(id);
}

/** Whether `name` is a task name the submit accepts (it then works as a container and dir name). */
export function isValidTaskName(name: string): boolean {
  return NAME_PATTERN.test(name);
}

/** Whether `name` is a volume name the submit accepts (it becomes a mount point's name). */
export function isValidVolumeName(name: string): boolean {
  return VOLUME_NAME_PATTERN.test(name);
}

/** Whether `user` is a container user the submit accepts: a name or uid, optionally `:group` or `:gid`. */
export function isValidContainerUser(user: string): boolean {
  return CONTAINER_USER_PATTERN.test(user);
}

/** Whether `name` has the syntax of an environment variable name (the submit also bounds its length). */
export function isEnvName(name: string): boolean {
  return ENV_NAME_PATTERN.test(name);
}

function absolutePath(value: string, field: string): string {
  if (value === "" || CONTROL.test(value) || value.length > 4096)
    fail(`invalid ${field}: ${JSON.stringify(value)}`);
  if (!value.startsWith("/") || posix.normalize(value) !== value || value.split("/").includes("..")) {
    fail(`${field} must be an absolute, normalised path: ${JSON.stringify(value)}`);
  }
  return value;
}

function list<T>(items: readonly T[], field: string): readonly T[] {
  if (items.length > MAX_LIST) fail(`too many ${field} (max ${MAX_LIST})`);
  return items;
}

function plainText(value: string, field: string, max = 4096): string {
  if (CONTROL.test(value) || value.length > max) fail(`invalid ${field}`);
  return value;
}

function sshKeys(keys: readonly string[], field: string): readonly string[] {
  return list(keys, field).map((key) => {
    if (key.trim().length === 0 || key.length > 16_384 || CONTROL.test(key)) {
      fail(`invalid key in ${field}: a single OpenSSH public key line is expected`);
    }
    try {
      // Rejects options, several keys in one entry, and anything that is not a public key.
      canonicalizePublicKey(key);
    } catch (cause) {
      throw new InvalidTaskConfigError(`invalid key in ${field}: ${errorMessage(cause)}`, { cause });
    }
    return key.trim();
  });
}

/** A field of the objects of a list field (a volume's `name`, a mount's `path`). */
interface ItemField<S extends TSchema = TSchema> {
  readonly schema: S;
  /** What an absent or null value reads as (Go's zero value). */
  readonly zero: Static<S>;
  /** Sent by dstack and ignored: the submit drops it, a stored config keeps it as it was written. */
  readonly dropped?: true;
}

type ItemFields = Readonly<Record<string, ItemField>>;

/** An object of a list field as the submit's rule sees it and the config keeps it: zero-filled. */
type Item<I extends ItemFields> = {
  readonly [K in keyof I as I[K] extends { readonly dropped: true } ? never : K]: Static<I[K]["schema"]>;
};

/**
 * One field of a task's config: see the table, {@link TASK_FIELDS}. `T` is the type its rule and
 * its default take (the table's entries are typed by their schema), `Z` its zero value's.
 */
export interface TaskField<S extends TSchema = TSchema, T = never, Z = unknown> {
  /** Its JSON type; on the wire it may also be null or absent, which read as `zero`. */
  readonly schema: S;
  /** What an absent or null value reads as, at submit and from task.json (Go's zero value). */
  readonly zero?: Z;
  /** Absent or null stays absent from the config (a taskshim extension with no zero value). */
  readonly optional?: true;
  /** Must not be empty: a submit without it answers `empty <field>`, a stored config is corrupt. */
  readonly required?: true;
  /** Registry credentials: read at submit into `RegistryAuth`, never in the config nor on disk. */
  readonly credential?: true;
  /** The objects of a list field, field by field. */
  readonly items?: ItemFields;
  /**
   * Where the submit checks this field among the others, lower first, then in the table's
   * order (default: after every numbered field). It keeps the order dstack's clients have always
   * seen, so a body with two bad fields gets the same first message from every release.
   */
  readonly order?: number;
  /**
   * The submit's rule, given the zero-filled value: returns what the config keeps, or throws
   * `InvalidTaskConfigError` with the wire's message. Never applied to a stored config.
   */
  readonly rule?: (value: T) => unknown;
  /** Turns a valid value into the config's (a default over the zero); applied to stored configs too. */
  readonly fill?: (value: T) => unknown;
}

/** A field's options, typed by its JSON type: the rule keeps the type, the default may narrow it. */
type FieldOptions<T> = Omit<TaskField<TSchema, T, T>, "schema" | "items" | "rule"> & {
  readonly rule?: (value: T) => T;
};

/** A field whose value is checked as a whole (a string, a number, a list of strings, a map). */
function field<S extends TSchema, const O extends FieldOptions<Static<S>>>(
  schema: S,
  options: O & FieldOptions<Static<S>>,
): { readonly schema: S } & O {
  return { schema, ...options };
}

const item = <S extends TSchema>(schema: S, zero: Static<S>): ItemField<S> => ({ schema, zero });
const dropped = <S extends TSchema>(schema: S, zero: Static<S>) => ({ schema, zero, dropped: true }) as const;

type Nullable<S extends TSchema> = ReturnType<typeof Type.Optional<TUnion<[S, TNull]>>>;
/** On the wire every field may also be null or absent (Go's decoder reads both as the zero value). */
const nullable = <S extends TSchema>(schema: S): Nullable<S> =>
  Type.Optional(Type.Union([schema, Type.Null()]));
type ItemSchema<I extends ItemFields> = TObject<{ [K in keyof I]: Nullable<I[K]["schema"]> }>;

/** A list of objects: each object's fields zero-filled, then the list's rule. */
function objects<const I extends ItemFields>(
  items: I,
  options: { readonly rule: (value: readonly Item<I>[]) => readonly Item<I>[] },
): {
  readonly schema: TArray<ItemSchema<I>>;
  readonly zero: readonly Item<I>[];
  readonly items: I;
} & typeof options {
  const properties = Object.fromEntries(Object.entries(items).map(([name, f]) => [name, nullable(f.schema)]));
  return { schema: Type.Array(Type.Object(properties) as ItemSchema<I>), zero: [], items, ...options };
}

/**
 * Every field of dstack-shim's `TaskConfig` and taskshim's two extensions (`command`, `env`),
 * in the wire's order (the OpenAPI document's, and the order of a config in task.json).
 * The submit reads a field as its zero value when absent or null, checks the required ones,
 * runs the rules (by `order`) and fills the defaults; a stored config gets the same zero values
 * and defaults after a check of its JSON types alone.
 */
export const TASK_FIELDS = {
  id: field(Type.String(), {
    zero: "",
    required: true,
    order: 1,
    rule: (id) =>
      isValidTaskId(id) ? id : fail("invalid id: use letters, digits, '_', '.', ':' or '-' (at most 128)"),
  }),
  name: field(Type.String(), {
    zero: "",
    required: true,
    order: 1,
    rule: (name) =>
      isValidTaskName(name) ? name : fail("invalid name: use letters, digits, '_', '.' or '-' (at most 101)"),
  }),
  registry_username: field(Type.String(), { zero: "", credential: true }),
  registry_password: field(Type.String(), { zero: "", credential: true }),
  image_name: field(Type.String(), {
    zero: "",
    required: true,
    order: 1,
    rule: (image) => {
      try {
        parseImageReference(image);
      } catch (cause) {
        throw new InvalidTaskConfigError(`invalid image_name: ${errorMessage(cause)}`, { cause });
      }
      return image;
    },
  }),
  container_user: field(Type.String(), {
    zero: "",
    order: 3,
    rule: (user) => (user === "" || isValidContainerUser(user) ? user : fail("invalid container_user")),
    fill: (user): string => (user === "" ? "root" : user),
  }),
  privileged: field(Type.Boolean(), { zero: false }),
  gpu: field(Type.Integer(), {
    zero: 0,
    order: 2,
    rule: (gpu) =>
      gpu < -1 || gpu > MAX_GPU
        ? fail(`invalid gpu: ${gpu} (use -1 for all, 0 for none, or 1..${MAX_GPU})`)
        : gpu,
  }),
  cpu: field(Type.Number(), {
    zero: 0,
    order: 2,
    rule: (cpu) => (!Number.isFinite(cpu) || cpu < 0 || cpu > MAX_CPU ? fail(`invalid cpu: ${cpu}`) : cpu),
  }),
  memory: field(Type.Integer(), {
    zero: 0,
    order: 2,
    rule: (memory) => (memory < 0 || memory > MAX_BYTES ? fail(`invalid memory: ${memory}`) : memory),
  }),
  shm_size: field(Type.Integer(), {
    zero: 0,
    order: 2,
    rule: (size) => (size < 0 || size > MAX_BYTES ? fail(`invalid shm_size: ${size}`) : size),
  }),
  network_mode: field(Type.String(), {
    zero: "",
    order: 2,
    rule: (mode) =>
      mode === "" || (NETWORK_MODES as readonly string[]).includes(mode)
        ? mode
        : fail(`invalid network_mode: ${JSON.stringify(mode)} (host or bridge)`),
    // A mode a newer release allows is kept as it was stored.
    fill: (mode) => (mode === "" ? "host" : mode) as (typeof NETWORK_MODES)[number],
  }),
  volumes: objects(
    {
      backend: item(Type.String(), ""),
      name: item(Type.String(), ""),
      volume_id: item(Type.String(), ""),
      init_fs: item(Type.Boolean(), false),
      device_name: item(Type.String(), ""),
    },
    {
      rule: (volumes) =>
        list(volumes, "volumes").map((v) => {
          if (!isValidVolumeName(v.name)) fail(`invalid volume name: ${JSON.stringify(v.name)}`);
          return {
            backend: plainText(v.backend, "volume backend", 32),
            name: v.name,
            volume_id: plainText(v.volume_id, "volume_id", 256),
            init_fs: v.init_fs,
            device_name: plainText(v.device_name, "device_name", 256),
          };
        }),
    },
  ),
  volume_mounts: objects(
    { name: item(Type.String(), ""), path: item(Type.String(), "") },
    {
      rule: (mounts) =>
        list(mounts, "volume_mounts").map((m) => {
          if (!isValidVolumeName(m.name)) fail(`invalid volume mount name: ${JSON.stringify(m.name)}`);
          return { name: m.name, path: absolutePath(m.path, "volume mount path") };
        }),
    },
  ),
  instance_mounts: objects(
    {
      instance_path: item(Type.String(), ""),
      path: item(Type.String(), ""),
      optional: dropped(Type.Boolean(), false),
    },
    {
      rule: (mounts) =>
        list(mounts, "instance_mounts").map((m) => ({
          instance_path: absolutePath(m.instance_path, "instance_path"),
          path: absolutePath(m.path, "instance mount path"),
        })),
    },
  ),
  gpu_devices: objects(
    { path_on_host: item(Type.String(), ""), path_in_container: item(Type.String(), "") },
    {
      rule: (devices) =>
        list(devices, "gpu_devices").map((d) => ({
          path_on_host: absolutePath(d.path_on_host, "path_on_host"),
          path_in_container: absolutePath(d.path_in_container, "path_in_container"),
        })),
    },
  ),
  host_ssh_user: field(Type.String(), {
    zero: "",
    order: 3,
    rule: (user) => (user === "" || USER_PATTERN.test(user) ? user : fail("invalid host_ssh_user")),
  }),
  host_ssh_keys: field(Type.Array(Type.String()), {
    zero: [],
    rule: (keys) => [...sshKeys(keys, "host_ssh_keys")],
  }),
  container_ssh_keys: field(Type.Array(Type.String()), {
    zero: [],
    rule: (keys) => [...sshKeys(keys, "container_ssh_keys")],
  }),
  /** taskshim extension: run this argv instead of the dstack-runner launch script. */
  command: field(Type.Array(Type.String()), {
    optional: true,
    rule: (argv) => {
      if (argv.length === 0) fail("command must not be empty");
      return list(argv, "command arguments").map((arg) =>
        arg.includes("\u0000") || arg.length > 65_536 ? fail("invalid command argument") : arg,
      );
    },
    // The submit refuses an empty argv; a stored one reads as no command, as it always has.
    fill: (argv): readonly string[] | undefined => (argv.length > 0 ? argv : undefined),
  }),
  /** taskshim extension: extra container environment. */
  env: field(Type.Record(Type.String(), Type.String()), {
    optional: true,
    rule: (env) => {
      const entries = Object.entries(env);
      if (entries.length > MAX_LIST) fail(`too many env entries (max ${MAX_LIST})`);
      const out: Record<string, string> = {};
      for (const [key, value] of entries) {
        // `__proto__` fits the pattern but cannot be a key of a plain object: it would vanish.
        if (!isEnvName(key) || key.length > MAX_ENV_NAME || key === "__proto__")
          fail(`invalid env name: ${JSON.stringify(key)}`);
        if (value.includes("\u0000") || value.length > 65_536) fail(`invalid env value for ${key}`);
        out[key] = value;
      }
      return out;
    },
    fill: (env): Readonly<Record<string, string>> => ({ ...env }),
  }),
} satisfies Readonly<Record<string, TaskField>>;

type Fields = typeof TASK_FIELDS;
/** A field's name. */
export type TaskFieldName = keyof Fields;

/** The JSON schema of `POST /api/tasks` (shape only; `parseTaskConfig` adds the rules). */
export const TaskSubmitBodySchema = Type.Object(
  Object.fromEntries(Object.entries(TASK_FIELDS).map(([name, f]) => [name, nullable(f.schema)])) as {
    [K in TaskFieldName]: Nullable<Fields[K]["schema"]>;
  },
);

/** The raw submit body as decoded from JSON. */
export type TaskSubmitBody = Static<typeof TaskSubmitBodySchema>;

type Frozen<T> = T extends readonly (infer E)[]
  ? readonly Frozen<E>[]
  : T extends object
    ? { readonly [K in keyof T]: Frozen<T[K]> }
    : T;
/** What the config keeps of a field: its default's type, else its rule's, else its JSON type's. */
type ConfigValue<F> = F extends { readonly fill: (value: never) => infer V }
  ? Exclude<V, undefined>
  : F extends { readonly rule: (value: never) => infer V }
    ? V
    : F extends { readonly schema: infer S extends TSchema }
      ? Static<S>
      : never;
type Kept = {
  [K in TaskFieldName]: Fields[K] extends { readonly credential: true } ? never : K;
}[TaskFieldName];
type Always = { [K in Kept]: Fields[K] extends { readonly optional: true } ? never : K }[Kept];

/** A normalised, validated task configuration, derived from {@link TASK_FIELDS}. Field names are the wire names. */
export type TaskConfig = {
  readonly [K in Always]: Frozen<ConfigValue<Fields[K]>>;
} & { readonly [K in Exclude<Kept, Always>]?: Frozen<ConfigValue<Fields[K]>> };
