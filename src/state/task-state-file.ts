import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { Task, UnknownStateFields } from "../tasks/task.js";
import type { TaskConfig } from "../tasks/task-config.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { writeFileDurably } from "./durable-write.js";
import { decodeStoredConfig, KNOWN_CONFIG_KEYS, unknownKeys } from "./stored-config.js";
import { errorMessage } from "../errors/error-message.js";

/** The state file's name inside a task dir (the same as dstack-shim's). */
export const TASK_STATE_FILE = "task.json";
// Set by scripts/build.mjs only for test builds that play a future, incompatible format.
declare const __TASKSHIM_STATE_VERSION__: number | undefined;

/**
 * The format version shared with dstack-shim >= 0.21.3; bumped only on incompatible changes.
 * Files of this version or older are read; newer ones are left alone.
 */
export const TASK_STATE_VERSION: number =
  typeof __TASKSHIM_STATE_VERSION__ === "number" ? __TASKSHIM_STATE_VERSION__ : 1;

/**
 * What task.json holds: the intent and the cleanup inputs that Docker cannot tell us. The first
 * six fields are dstack-shim's v1 format; the rest are taskshim extensions, ignored by readers
 * that do not know them. Container id, GPUs and ports are deliberately absent: the container
 * is the truth for those.
 */
export interface TaskState {
  readonly version: number;
  readonly id: string;
  readonly config: TaskConfig;
  readonly termination_reason: TerminationReason | "";
  readonly termination_message: string;
  readonly cleaned_up: boolean;
  /** taskshim: the last committed status (absent in files written by dstack-shim). */
  readonly status?: TaskStatus;
  /** taskshim: the exit code once known; null = unknown. */
  readonly exit_code?: number | null;
  /** taskshim: the kernel boot id when the task was last persisted. */
  readonly boot_id?: string;
  /**
   * taskshim: the task was adopted from a container alone (`--adopt-unowned`), so its host keys
   * are unknown and entries are never removed while it lives.
   */
  readonly keys_unknown?: boolean;
  /** taskshim: when the task was submitted, started and finished (ISO 8601, absent = unknown). */
  readonly created_at?: string;
  readonly started_at?: string;
  readonly finished_at?: string;
  /** Fields this version does not know (a newer release's), written back unchanged. */
  readonly unknown_fields?: UnknownStateFields;
}

const iso = (ms: number | undefined): string | undefined =>
  ms === undefined || !Number.isFinite(ms) ? undefined : new Date(ms).toISOString();

/** An ISO 8601 time back to epoch ms; undefined for anything else (an older file has none). */
export function epochOf(value: unknown): number | undefined {
  if (typeof value !== "string") return undefined;
  const ms = Date.parse(value);
  return Number.isFinite(ms) ? ms : undefined;
}

/** The file is unreadable as a task state (bad JSON, wrong shape, invalid config). */
export class CorruptTaskStateError extends Error {
  override readonly name = "CorruptTaskStateError";
}
/** The file was written by a newer, incompatible format. */
export class UnsupportedTaskStateVersionError extends Error {
  override readonly name = "UnsupportedTaskStateVersionError";
  constructor(readonly version: unknown) {
    super(`unsupported task state version ${JSON.stringify(version)}`);
  }
}

/** Serialises a task; registry credentials are blanked (they never reach disk). */
export function encodeTaskState(task: Task, bootId: string): string {
  const unknown = task.unknownFields;
  // A newer release's fields go first and are overwritten by every field this version knows:
  // they are written back unchanged, and can never shadow what this version means.
  const state = {
    ...unknown?.file,
    version: TASK_STATE_VERSION,
    id: task.id,
    config: { ...unknown?.config, ...task.config, registry_username: "", registry_password: "" },
    termination_reason: task.terminationReason,
    termination_message: task.terminationMessage,
    cleaned_up: task.cleanedUp,
    status: task.status,
    // Absent = not known yet; null = can never be known (the container vanished).
    // Stryker disable next-line ConditionalExpression: JSON.stringify drops an undefined exit_code anyway.
    ...(task.exitCode !== undefined ? { exit_code: task.exitCode } : {}),
    boot_id: bootId,
    ...(task.degraded === true ? { keys_unknown: true } : {}),
    created_at: iso(task.createdAt),
    started_at: iso(task.startedAt),
    finished_at: iso(task.finishedAt),
  };
  return `${JSON.stringify(state)}\n`;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** The top-level keys this version knows; any other key is kept and written back. */
const KNOWN_STATE_KEYS: ReadonlySet<string> = new Set([
  "version",
  "id",
  "config",
  "termination_reason",
  "termination_message",
  "cleaned_up",
  "status",
  "exit_code",
  "boot_id",
  "keys_unknown",
  "created_at",
  "started_at",
  "finished_at",
]);

/**
 * A stored reason: a known one, or one a newer release (or a newer dstack) knows, kept as
 * written rather than losing the task's end over a word.
 */
const STORED_REASON = /^[a-z][a-z0-9_]{0,63}$/;

/**
 * Parses task.json text by its structure: the types of its fields and the fields a restore
 * needs, never today's submit policy (a config an older release accepted restores after the
 * rule is tightened). Fields this version does not know are kept in `unknown_fields`; a status
 * it does not know (a newer release's) is read as absent, so the restore decides from the
 * reason and the container. See docs/architecture.md, "State format and compatibility".
 */
export function decodeTaskState(text: string): TaskState {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (cause) {
    throw new CorruptTaskStateError("task state is not valid JSON", { cause });
  }
  if (!isRecord(raw)) throw new CorruptTaskStateError("task state is not a JSON object");
  if (typeof raw.version !== "number" || !Number.isInteger(raw.version) || raw.version < 1) {
    throw new CorruptTaskStateError(`task state has an invalid version ${JSON.stringify(raw.version)}`);
  }
  if (raw.version > TASK_STATE_VERSION) throw new UnsupportedTaskStateVersionError(raw.version);
  if (typeof raw.id !== "string" || raw.id === "") throw new CorruptTaskStateError("task state has no id");
  let config: TaskConfig;
  try {
    config = decodeStoredConfig(raw.config);
  } catch (cause) {
    throw new CorruptTaskStateError(`task state has an invalid config: ${errorMessage(cause)}`, {
      cause,
    });
  }
  if (config.id !== raw.id) throw new CorruptTaskStateError("task state id does not match its config");
  const reasonValue = raw.termination_reason ?? "";
  if (typeof reasonValue !== "string")
    throw new CorruptTaskStateError(`task state has an invalid termination_reason`);
  const reason = reasonValue.trim().toLowerCase();
  if (reason !== "" && !STORED_REASON.test(reason)) {
    throw new CorruptTaskStateError(`task state has an invalid termination_reason`);
  }
  const status = raw.status;
  if (status !== undefined && typeof status !== "string") {
    throw new CorruptTaskStateError("task state has an invalid status");
  }
  const exitCode = raw.exit_code;
  if (exitCode !== undefined && exitCode !== null && !Number.isInteger(exitCode)) {
    throw new CorruptTaskStateError("task state has an invalid exit_code");
  }
  const file = unknownKeys(raw, KNOWN_STATE_KEYS);
  const configExtra = unknownKeys(raw.config as Record<string, unknown>, KNOWN_CONFIG_KEYS);
  return {
    version: TASK_STATE_VERSION,
    id: raw.id,
    config,
    // A reason this version does not list is a newer release's: shown as it was written.
    termination_reason: reason as TerminationReason | "",
    termination_message: typeof raw.termination_message === "string" ? raw.termination_message : "",
    cleaned_up: raw.cleaned_up === true,
    ...(isTaskStatus(status) ? { status } : {}),
    ...(exitCode !== undefined ? { exit_code: exitCode as number | null } : {}),
    ...(typeof raw.boot_id === "string" ? { boot_id: raw.boot_id } : {}),
    ...(raw.keys_unknown === true ? { keys_unknown: true } : {}),
    ...(epochOf(raw.created_at) !== undefined ? { created_at: raw.created_at as string } : {}),
    ...(epochOf(raw.started_at) !== undefined ? { started_at: raw.started_at as string } : {}),
    ...(epochOf(raw.finished_at) !== undefined ? { finished_at: raw.finished_at as string } : {}),
    ...(file !== undefined || configExtra !== undefined
      ? {
          unknown_fields: {
            ...(file !== undefined ? { file } : {}),
            ...(configExtra !== undefined ? { config: configExtra } : {}),
          },
        }
      : {}),
  };
}

const isTaskStatus = (value: unknown): value is TaskStatus =>
  (TASK_STATUSES as readonly unknown[]).includes(value);

/** Reads `<taskDir>/task.json`. */
export async function readTaskState(taskDir: string): Promise<TaskState> {
  return decodeTaskState(await readFile(join(taskDir, TASK_STATE_FILE), "utf8"));
}

/** Writes `<taskDir>/task.json` durably. */
export async function writeTaskState(taskDir: string, task: Task, bootId: string): Promise<void> {
  await writeFileDurably(join(taskDir, TASK_STATE_FILE), encodeTaskState(task, bootId));
}
