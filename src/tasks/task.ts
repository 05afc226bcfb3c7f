import type { ImagePullProgress, PortMapping } from "./task-parts.js";
import { containerNameFor } from "./container-name.js";
import type { TaskConfig } from "./task-config.js";
import type { TaskStatus } from "./task-status.js";
import type { TerminationReason } from "./termination-reason.js";

/**
 * A task as the shim holds it in memory: a cache rebuilt at startup from Docker (containers)
 * and task.json (intent and cleanup inputs).
 *
 * What is not known yet is absent (an optional field), never `""` or `null`; `null` is a value
 * of its own: the exit code that can never be known. The wire view (`api/wire.ts`) turns absent
 * fields into dstack's `""` and `null`.
 */
export interface Task {
  readonly id: string;
  readonly status: TaskStatus;
  /**
   * "" until terminated, or until a terminate is requested: a task whose container is stopping
   * stays `running` with the requested reason recorded (the terminate's intent, durable in
   * task.json), shown only once it is `terminated`. A terminated task always has a valid reason.
   */
  readonly terminationReason: TerminationReason | "";
  readonly terminationMessage: string;
  readonly config: TaskConfig;
  readonly containerName: string;
  /** Absent until the container is created (or adopted). */
  readonly containerId?: string;
  /** Absent until the container is started (`[]` in host network mode). */
  readonly ports?: readonly PortMapping[];
  /** GPUs this task locked itself (and so may release). */
  readonly gpuIds: readonly string[];
  /** Absent until the pull reports its first layer. */
  readonly pullProgress?: ImagePullProgress;
  /** The private task dir; "" until created. */
  readonly taskDir: string;
  /** The task's resources have been released (committed before the release runs). */
  readonly cleanedUp: boolean;
  /** A start owns this task and its resources; the reconciler leaves it alone. */
  readonly startInFlight: boolean;
  /** When the task was submitted (epoch ms); absent for a task restored from its container alone. */
  readonly createdAt?: number;
  /**
   * When its container started (epoch ms): the engine's StartedAt when an inspect tells it, else
   * when the start call returned; absent until `running`, or when unknown. `TaskStore` keeps the
   * three times in order, createdAt ≤ startedAt ≤ finishedAt (`task-times.ts`).
   */
  readonly startedAt?: number;
  /** When it became `terminated` (epoch ms): the container's own finish time when it exited. */
  readonly finishedAt?: number;
  /**
   * The container's exit code; absent until read, null when it can never be known (the container
   * vanished or never started).
   */
  readonly exitCode?: number | null;
  /**
   * Why this version leaves the task alone ({@link TaskHold}): shown read-only, never persisted,
   * released, resumed, terminated or removed. Absent for every task this version owns.
   */
  readonly held?: TaskHold;
  /**
   * Restored from its container alone (no readable state file): its config, and so its host
   * keys and volumes, are unknown.
   */
  readonly degraded?: boolean;
  /** Restored from a state file written before the host's last reboot. */
  readonly acrossReboot?: boolean;
  /**
   * What its task.json held that this version does not know (a newer release's fields), kept
   * so that every rewrite writes them back unchanged: `file` at the top level, `config` in the
   * config object.
   */
  readonly unknownFields?: UnknownStateFields;
}

/**
 * Why a task's state file is left alone by this version, and so the task with it:
 * - `newer-format`: its task.json has a `version` above the one this version writes (a newer
 *   taskshim's, seen after a rollback);
 * - `newer-status`: its task.json is of this format but has a status this version does not know
 *   (a newer release's pending task, say);
 * - `unquarantined`: its task.json could not be read, and moving it to the quarantine failed:
 *   it stays where it is, as evidence, until a human moves it.
 *
 * `status` is the status the file holds, as written, when the wire cannot carry it.
 */
export type TaskHold =
  | { readonly kind: "newer-format"; readonly version: number; readonly status?: string }
  | { readonly kind: "newer-status"; readonly status: string }
  | { readonly kind: "unquarantined"; readonly reason: string };

/**
 * The one line a request on a held task is refused with (HTTP 409), naming why this version
 * leaves it alone.
 */
export function heldMessage(id: string, hold: TaskHold): string {
  switch (hold.kind) {
    case "newer-format":
      return `task ${id} is held by a newer taskshim (task.json version ${hold.version}): this release leaves it alone`;
    case "newer-status":
      return `task ${id} is held by a newer taskshim (task.json status ${JSON.stringify(hold.status)}): this release leaves it alone`;
    case "unquarantined":
      return `task ${id} has a task.json this release cannot read and could not move to the quarantine (${hold.reason}): it is left as it is until a human moves it`;
  }
}

/** The fields of a stored task state that this version does not know (see `Task.unknownFields`). */
export interface UnknownStateFields {
  readonly file?: Readonly<Record<string, unknown>>;
  readonly config?: Readonly<Record<string, unknown>>;
}

/** A mutable draft handed to `TaskStore.modify`. */
export type TaskDraft = { -readonly [K in keyof Task]: Task[K] };

/** A new task in `pending`, holding nothing yet. */
export function newTask(config: TaskConfig): Task {
  return {
    id: config.id,
    status: "pending",
    terminationReason: "",
    terminationMessage: "",
    config,
    containerName: containerNameFor(config.name, config.id),
    gpuIds: [],
    taskDir: "",
    cleanedUp: false,
    startInFlight: false,
    createdAt: Date.now(),
  };
}
