import { isEnvName, isValidContainerUser, NETWORK_MODES } from "../tasks/task-fields.js";
import { InvalidSizeError, parseSize } from "./sizes.js";

/** A submit flag (or config file) that cannot become a task config; the message names it. */
export class InvalidSubmitFlagError extends Error {
  override readonly name = "InvalidSubmitFlagError";
}

/** `taskshim tasks submit`'s flags, as the command line gives them (strings, unparsed). */
export interface SubmitFlags {
  readonly id?: string | undefined;
  readonly name?: string | undefined;
  readonly image?: string | undefined;
  /** `--command ARG...` or the words after `--`. */
  readonly command?: readonly string[] | undefined;
  /** `K=V`, or `K` alone to pass this shell's value through (as `docker run -e K`). */
  readonly env?: readonly string[] | undefined;
  readonly gpu?: string | undefined;
  readonly cpu?: string | undefined;
  readonly memory?: string | undefined;
  readonly shm?: string | undefined;
  /** `/host/path:/container/path` → `instance_mounts`. */
  readonly mount?: readonly string[] | undefined;
  readonly network?: string | undefined;
  readonly registryUser?: string | undefined;
  readonly registryPassword?: string | undefined;
  readonly privileged?: boolean | undefined;
  /** `--user` → `container_user` (the shim's default is root, as dstack-shim's). */
  readonly user?: string | undefined;
}

/** The `POST /api/tasks` body the CLI sends (dstack-shim's TaskConfig plus taskshim's extensions). */
export type SubmitBody = Record<string, unknown> & { readonly id: string };

function fail(message: string): never {
  throw new InvalidSubmitFlagError(message);
}

function size(value: string, flag: string): number {
  // `--memory 4 GB` would read 4 bytes and make `GB` a word of the command: one token, with a unit.
  if (/\s/.test(value.trim()))
    fail(`${flag}: write the size as one word, like 4GiB (got ${JSON.stringify(value)})`);
  if (/^\d+(\.\d+)?$/.test(value.trim()) && Number(value) !== 0) {
    fail(
      `${flag}: give a unit, like ${value.trim()}GiB or ${value.trim()}MiB (got ${JSON.stringify(value)})`,
    );
  }
  try {
    return parseSize(value);
  } catch (error) {
    if (error instanceof InvalidSizeError) fail(`${flag}: ${error.message}`);
    throw error;
  }
}

/** Parses `--env` entries into a map; `K` alone takes `K` from `lookup` (this shell's env). */
export function parseEnvFlags(
  entries: readonly string[],
  lookup: (name: string) => string | undefined,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const entry of entries) {
    const eq = entry.indexOf("=");
    const key = eq === -1 ? entry : entry.slice(0, eq);
    if (!isEnvName(key)) fail(`--env: invalid variable name in ${JSON.stringify(entry)}`);
    const value = eq === -1 ? lookup(key) : entry.slice(eq + 1);
    if (value === undefined) fail(`--env: ${key} is not set in this shell (use ${key}=VALUE)`);
    env[key] = value;
  }
  return env;
}

/** Parses `--mount /host:/container` into an `instance_mounts` entry. */
export function parseMountFlag(entry: string): { instance_path: string; path: string } {
  const parts = entry.split(":");
  const [host, container] = parts;
  if (parts.length !== 2 || !host?.startsWith("/") || !container?.startsWith("/")) {
    fail(`--mount: expected /host/path:/container/path, got ${JSON.stringify(entry)}`);
  }
  return { instance_path: host, path: container };
}

/**
 * A task name from an image reference (`ghcr.io/acme/train:v2` → `train`): the shim requires a
 * name, and one that says what runs reads better in `tasks ls` than a generated word.
 */
export function nameFromImage(image: string): string {
  const lastPart = image.split("@")[0]?.split("/").at(-1) ?? "";
  const repo = lastPart.split(":")[0] ?? "";
  const clean = repo.replace(/[^A-Za-z0-9_.-]/g, "-").replace(/^[^A-Za-z0-9]+/, "");
  return clean.slice(0, 64) || "task";
}

/**
 * Builds the submit body from an optional config file (the JSON body as is) and flags; a flag
 * overrides the file's field, `--env` and `--mount` add to the file's. Values the shim would
 * refuse anyway (bad sizes, counts, network modes) are refused here with the flag's name, so
 * the operator sees which flag to fix; where the flag's value is the field's, the check is the
 * field's own (tasks/task-fields.ts), so the two cannot drift.
 */
export function buildSubmitBody(
  file: Readonly<Record<string, unknown>> | undefined,
  flags: SubmitFlags,
  options: { readonly newId: () => string; readonly env: (name: string) => string | undefined },
): SubmitBody {
  const body: Record<string, unknown> = { ...file };
  if (flags.image !== undefined) body.image_name = flags.image;
  if (typeof body.image_name !== "string" || body.image_name === "") {
    fail("no image: give --image IMAGE or image_name in --file");
  }
  if (flags.id !== undefined) body.id = flags.id;
  if (body.id === undefined || body.id === null || body.id === "") body.id = options.newId();
  if (typeof body.id !== "string") fail("id must be a string");
  if (flags.name !== undefined) body.name = flags.name;
  if (body.name === undefined || body.name === null || body.name === "") {
    body.name = nameFromImage(body.image_name);
  }
  if (flags.command !== undefined && flags.command.length > 0) body.command = [...flags.command];

  if (flags.env !== undefined && flags.env.length > 0) {
    const base = body.env;
    if (base !== undefined && base !== null && (typeof base !== "object" || Array.isArray(base))) {
      fail("env in --file must be an object of NAME: value");
    }
    body.env = {
      ...(base as Record<string, string> | null | undefined),
      ...parseEnvFlags(flags.env, options.env),
    };
  }
  if (flags.mount !== undefined && flags.mount.length > 0) {
    const base = body.instance_mounts ?? [];
    if (!Array.isArray(base)) fail("instance_mounts in --file must be a list");
    body.instance_mounts = [...(base as unknown[]), ...flags.mount.map(parseMountFlag)];
  }
  if (flags.gpu !== undefined) {
    const gpu = Number(flags.gpu);
    if (!/^-?\d+$/.test(flags.gpu.trim()) || gpu < -1) {
      fail(`--gpu: expected -1 (all), 0 (none) or a count, got ${JSON.stringify(flags.gpu)}`);
    }
    body.gpu = gpu;
  }
  if (flags.cpu !== undefined) {
    const cpu = Number(flags.cpu);
    if (flags.cpu.trim() === "" || !Number.isFinite(cpu) || cpu < 0) {
      fail(`--cpu: expected a number of CPUs (0 = all), got ${JSON.stringify(flags.cpu)}`);
    }
    body.cpu = cpu;
  }
  if (flags.memory !== undefined) body.memory = size(flags.memory, "--memory");
  if (flags.shm !== undefined) body.shm_size = size(flags.shm, "--shm");
  if (flags.network !== undefined) {
    if (!(NETWORK_MODES as readonly string[]).includes(flags.network)) {
      fail(`--network: expected host or bridge, got ${JSON.stringify(flags.network)}`);
    }
    body.network_mode = flags.network;
  }
  if (flags.registryUser !== undefined) body.registry_username = flags.registryUser;
  if (flags.registryPassword !== undefined) body.registry_password = flags.registryPassword;
  if (flags.privileged === true) body.privileged = true;
  if (flags.user !== undefined) {
    if (!isValidContainerUser(flags.user)) {
      fail(
        `--user: expected a user name or uid, optionally :group or :gid, got ${JSON.stringify(flags.user)}`,
      );
    }
    body.container_user = flags.user;
  }
  return body as SubmitBody;
}
