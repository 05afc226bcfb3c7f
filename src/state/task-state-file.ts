import { join } from "node:path";
import type { Task, UnknownStateFields } from "../tasks/task.js";
import { isValidTaskId, isValidTaskName, type TaskConfig } from "../tasks/task-config.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { describeBytes, readBoundedFileSync } from "./bounded-read.js";
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
 * The largest task.json a start reads: a larger one is quarantined unread (a 63 MB file of
 * unknown fields was loaded whole, and rewritten with an fsync at every change). A submit whose
 * state would exceed half of it is refused, so the reason, message and times a task gains later
 * always fit; the writer refuses anything beyond it, so what the shim writes, it reads.
 */
export const TASK_STATE_MAX_BYTES = 1024 * 1024;

/** The largest task.json a submit may create (see {@link TASK_STATE_MAX_BYTES}). */
export const TASK_STATE_SUBMIT_MAX_BYTES = TASK_STATE_MAX_BYTES / 2;

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
  /**
   * A status this version does not know, as written (a newer release's, in this version's
   * format): the task is held, shown read-only and never acted on.
   */
  readonly unknown_status?: string;
}

/**
 * What can be read of a newer release's task.json (a `version` above
 * {@link TASK_STATE_VERSION}), to show its task read-only: nothing of it is acted on, and a field
 * that cannot be read is absent.
 */
export interface NewerTaskStateView {
  readonly version: number;
  /** A valid task id: a file without one cannot be shown as a task (its dir is held all the same). */
  readonly id: string;
  readonly name?: string;
  readonly image_name?: string;
  /** As written, whether this version knows it or not. */
  readonly status?: string;
  readonly termination_reason: string;
  readonly termination_message: string;
  readonly exit_code?: number | null;
  readonly created_at?: string;
  readonly started_at?: string;
  readonly finished_at?: string;
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
  constructor(
    readonly version: unknown,
    /** What could be read of it, to show its task read-only (undefined: not even its id). */
    readonly view?: NewerTaskStateView,
  ) {
    super(`unsupported task state version ${JSON.stringify(version)}`);
  }
}
/** The task state would be larger than {@link TASK_STATE_MAX_BYTES}: it is not written. */
export class TaskStateTooLargeError extends Error {
  override readonly name = "TaskStateTooLargeError";
  constructor(
    readonly bytes: number,
    readonly limitBytes: number,
  ) {
    super(`task state would be ${bytes} bytes, above the ${describeBytes(limitBytes)} limit`);
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

/** A string shown in a message: control characters escaped, at most 64 characters. */
const shown = (value: string): string =>
  `${JSON.stringify(value.slice(0, 64))}${value.length > 64 ? ` (${value.length} characters)` : ""}`;

/**
 * Parses task.json text by its structure: the types of its fields and the fields a restore
 * needs, never today's submit policy (a config an older release accepted restores after the
 * rule is tightened). The exceptions are the id and the name, whose rules have not changed
 * since the first release: they become a label, a URL segment and a dir name, so a forged one
 * (300 characters, a slash, a control character) is refused as corrupt. Fields this version
 * does not know are kept in `unknown_fields`; a status it does not know is a newer release's,
 * kept as written in `unknown_status` (the task is then held, never acted on). See
 * docs/architecture.md, "State format and compatibility".
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
  if (raw.version > TASK_STATE_VERSION) {
    throw new UnsupportedTaskStateVersionError(raw.version, newerView(raw, raw.version));
  }
  if (typeof raw.id !== "string" || raw.id === "") throw new CorruptTaskStateError("task state has no id");
  if (!isValidTaskId(raw.id))
    throw new CorruptTaskStateError(`task state has an invalid id ${shown(raw.id)}`);
  let config: TaskConfig;
  try {
    config = decodeStoredConfig(raw.config);
  } catch (cause) {
    throw new CorruptTaskStateError(`task state has an invalid config: ${errorMessage(cause)}`, {
      cause,
    });
  }
  if (config.id !== raw.id) throw new CorruptTaskStateError("task state id does not match its config");
  if (!isValidTaskName(config.name)) {
    throw new CorruptTaskStateError(`task state has an invalid name ${shown(config.name)}`);
  }
  const reasonValue = raw.termination_reason ?? "";
  if (typeof reasonValue !== "string")
    throw new CorruptTaskStateError(`task state has an invalid termination_reason`);
  const reason = reasonValue.trim().toLowerCase();
  if (reason !== "" && !STORED_REASON.test(reason)) {
    throw new CorruptTaskStateError(`task state has an invalid termination_reason`);
  }
  const status = raw.status;
  if (status !== undefined && (typeof status !== "string" || !STORED_STATUS.test(status))) {
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
    ...(status !== undefined && !isTaskStatus(status) ? { unknown_status: status } : {}),
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

/** A stored status: one this version knows, or a newer release's of the same shape. */
const STORED_STATUS = /^[a-z][a-z0-9_]{0,63}$/;

const isTaskStatus = (value: unknown): value is TaskStatus =>
  (TASK_STATUSES as readonly unknown[]).includes(value);

/** The longest image name a newer file's view keeps (it is only shown). */
const MAX_SHOWN_IMAGE = 4096;

/**
 * What can be read of a newer release's file, field by field and forgiving (undefined when it
 * has not even a valid task id): it is only shown, never acted on or written.
 */
function newerView(raw: Record<string, unknown>, version: number): NewerTaskStateView | undefined {
  const id = raw.id;
  if (typeof id !== "string" || !isValidTaskId(id)) return undefined;
  const config = isRecord(raw.config) ? raw.config : {};
  const text = (value: unknown): string | undefined => (typeof value === "string" ? value : undefined);
  const name = text(config.name);
  const image = text(config.image_name);
  const status = text(raw.status);
  const reason = text(raw.termination_reason)?.trim().toLowerCase() ?? "";
  const exitCode = raw.exit_code;
  const time = (value: unknown): string | undefined =>
    epochOf(value) !== undefined ? (value as string) : undefined;
  const created = time(raw.created_at);
  const started = time(raw.started_at);
  const finished = time(raw.finished_at);
  return {
    version,
    id,
    ...(name !== undefined && isValidTaskName(name) ? { name } : {}),
    ...(image !== undefined && image !== "" && image.length <= MAX_SHOWN_IMAGE ? { image_name: image } : {}),
    ...(status !== undefined && STORED_STATUS.test(status) ? { status } : {}),
    termination_reason: STORED_REASON.test(reason) ? reason : "",
    termination_message: text(raw.termination_message) ?? "",
    ...(exitCode === null || Number.isInteger(exitCode) ? { exit_code: exitCode as number | null } : {}),
    ...(created !== undefined ? { created_at: created } : {}),
    ...(started !== undefined ? { started_at: started } : {}),
    ...(finished !== undefined ? { finished_at: finished } : {}),
  };
}

/**
 * Reads `<taskDir>/task.json`: a regular file of at most {@link TASK_STATE_MAX_BYTES}, never
 * through a symlink nor by a blocking open (`readBoundedFileSync`: `NotRegularFileError`,
 * `FileTooLargeError`), then decoded (`CorruptTaskStateError`, `UnsupportedTaskStateVersionError`).
 * Synchronous: read by the restore's scan alone, before the shim serves (see `TaskDirs.scan`).
 */
export function readTaskState(taskDir: string): TaskState {
  return decodeTaskState(readBoundedFileSync(join(taskDir, TASK_STATE_FILE), TASK_STATE_MAX_BYTES));
}

/** The size task.json would have for `task`, in bytes. */
export function encodedTaskStateBytes(task: Task, bootId: string): number {
  return Buffer.byteLength(encodeTaskState(task, bootId), "utf8");
}

/**
 * Writes `<taskDir>/task.json` durably; a state larger than {@link TASK_STATE_MAX_BYTES} is not
 * written (`TaskStateTooLargeError`): a start would quarantine it unread.
 */
export async function writeTaskState(taskDir: string, task: Task, bootId: string): Promise<void> {
  const text = encodeTaskState(task, bootId);
  const bytes = Buffer.byteLength(text, "utf8");
  if (bytes > TASK_STATE_MAX_BYTES) throw new TaskStateTooLargeError(bytes, TASK_STATE_MAX_BYTES);
  await writeFileDurably(join(taskDir, TASK_STATE_FILE), text);
}
