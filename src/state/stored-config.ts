import type { TaskConfig } from "../tasks/task-config.js";

/*
 * The `config` of a task.json, read as a stored record, not as a request. The HTTP submit
 * validator (`parseTaskConfig`) enforces today's policy (name patterns, limits, allowed values);
 * a config that an older release accepted and stored must still restore after that policy is
 * tightened, or an upgrade would strip a running task of its config. So this reader checks only
 * the structure: each field has its type (Go's zero value when absent or null, as dstack-shim
 * writes nil slices), and the three fields a restore cannot do without are present. The config
 * was validated once, at submit; the file lives in the shim's private 0700 task dir.
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

/** A field of `record` of the expected JSON type, or its zero value when absent or null. */
function field<T>(record: Json, key: string, check: (v: unknown) => v is T, zero: T, path: string): T {
  const value = record[key];
  if (value === undefined || value === null) return zero;
  if (!check(value)) fail(`${path}${key} has the wrong type`);
  return value;
}

const isString = (v: unknown): v is string => typeof v === "string";
const isBoolean = (v: unknown): v is boolean => typeof v === "boolean";
const isNumber = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
const isInteger = (v: unknown): v is number => Number.isInteger(v);

/**
 * An array of objects, each with the given string/boolean fields; the objects keep every other
 * key they hold (a newer release's field is written back unchanged).
 */
function records(record: Json, key: string, fields: Readonly<Record<string, "string" | "boolean">>): Json[] {
  const items = field(record, key, Array.isArray, [] as unknown[], "");
  return items.map((item, i) => {
    if (!isRecord(item)) fail(`${key}[${i}] is not an object`);
    const out: Json = { ...item };
    for (const [name, type] of Object.entries(fields)) {
      out[name] =
        type === "string"
          ? field(item, name, isString, "", `${key}[${i}].`)
          : field(item, name, isBoolean, false, `${key}[${i}].`);
    }
    return out;
  });
}

function strings(record: Json, key: string): string[] {
  const items = field(record, key, Array.isArray, [] as unknown[], "");
  if (!items.every(isString)) fail(`${key} holds a value that is not a string`);
  return items;
}

/** The keys this version knows; any other key of a stored config is kept and written back. */
export const KNOWN_CONFIG_KEYS: ReadonlySet<string> = new Set([
  "id",
  "name",
  "registry_username",
  "registry_password",
  "image_name",
  "container_user",
  "privileged",
  "gpu",
  "cpu",
  "memory",
  "shm_size",
  "network_mode",
  "volumes",
  "volume_mounts",
  "instance_mounts",
  "gpu_devices",
  "host_ssh_user",
  "host_ssh_keys",
  "container_ssh_keys",
  "command",
  "env",
]);

/**
 * Reads a stored config by its structure alone, with the defaults the submit applies
 * (`container_user` "root", `network_mode` "host"). Throws `StoredConfigError`.
 */
export function decodeStoredConfig(raw: unknown): TaskConfig {
  if (!isRecord(raw)) fail("config is not an object");
  const required = (key: string): string => {
    const value = field(raw, key, isString, "", "");
    if (value === "") fail(`config has no ${key}`);
    return value;
  };
  const id = required("id");
  const name = required("name");
  const image = required("image_name");
  const command = raw.command === undefined || raw.command === null ? undefined : strings(raw, "command");
  const env = field(raw, "env", isRecord, undefined, "");
  if (env !== undefined && !Object.values(env).every(isString))
    fail("env holds a value that is not a string");
  const containerUser = field(raw, "container_user", isString, "", "");
  const networkMode = field(raw, "network_mode", isString, "", "");
  return {
    id,
    name,
    image_name: image,
    container_user: containerUser === "" ? "root" : containerUser,
    privileged: field(raw, "privileged", isBoolean, false, ""),
    gpu: field(raw, "gpu", isInteger, 0, ""),
    cpu: field(raw, "cpu", isNumber, 0, ""),
    memory: field(raw, "memory", isInteger, 0, ""),
    shm_size: field(raw, "shm_size", isInteger, 0, ""),
    // "" is dstack-shim's default (host); a mode a newer release allows is kept as it was stored.
    network_mode: (networkMode === "" ? "host" : networkMode) as TaskConfig["network_mode"],
    volumes: records(raw, "volumes", {
      backend: "string",
      name: "string",
      volume_id: "string",
      init_fs: "boolean",
      device_name: "string",
    }) as unknown as TaskConfig["volumes"],
    volume_mounts: records(raw, "volume_mounts", {
      name: "string",
      path: "string",
    }) as unknown as TaskConfig["volume_mounts"],
    instance_mounts: records(raw, "instance_mounts", {
      instance_path: "string",
      path: "string",
    }) as unknown as TaskConfig["instance_mounts"],
    gpu_devices: records(raw, "gpu_devices", {
      path_on_host: "string",
      path_in_container: "string",
    }) as unknown as TaskConfig["gpu_devices"],
    host_ssh_user: field(raw, "host_ssh_user", isString, "", ""),
    host_ssh_keys: strings(raw, "host_ssh_keys"),
    container_ssh_keys: strings(raw, "container_ssh_keys"),
    ...(command !== undefined && command.length > 0 ? { command } : {}),
    ...(env !== undefined ? { env: { ...(env as Record<string, string>) } } : {}),
  };
}

/** The keys of a stored config (or of a whole file) that this version does not know. */
export function unknownKeys(raw: Json, known: ReadonlySet<string>): Json | undefined {
  const extra = Object.fromEntries(Object.entries(raw).filter(([key]) => !known.has(key)));
  return Object.keys(extra).length > 0 ? extra : undefined;
}
