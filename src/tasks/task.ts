import type { PortMapping } from "../docker/docker-client.js";
import type { ImagePullProgress } from "../docker/pull-progress.js";
import { containerNameFor } from "./container-name.js";
import type { TaskConfig } from "./task-config.js";
import type { TaskStatus } from "./task-status.js";
import type { TerminationReason } from "./termination-reason.js";

/**
 * A task as the shim holds it in memory: a cache rebuilt at startup from Docker (containers)
 * and task.json (intent and cleanup inputs).
 */
export interface Task {
  readonly id: string;
  readonly status: TaskStatus;
  /** "" until terminated; a terminated task always has a valid reason. */
  readonly terminationReason: TerminationReason | "";
  readonly terminationMessage: string;
  readonly config: TaskConfig;
  readonly containerName: string;
  /** "" until the container is created (or adopted). */
  readonly containerId: string;
  /** null until the container is started. */
  readonly ports: readonly PortMapping[] | null;
  /** GPUs this task locked itself (and so may release). */
  readonly gpuIds: readonly string[];
  readonly pullProgress: ImagePullProgress | null;
  /** The private task dir; "" until created. */
  readonly taskDir: string;
  /** The task's resources have been released (committed before the release runs). */
  readonly cleanedUp: boolean;
  /** A start owns this task and its resources; the reconciler leaves it alone. */
  readonly startInFlight: boolean;
  /** When the task was submitted (epoch ms); absent for a task restored from its container alone. */
  readonly createdAt?: number;
  /** When it became `running` (epoch ms); absent until then, or when unknown. */
  readonly startedAt?: number;
  /** When it became `terminated` (epoch ms): the container's own finish time when it exited. */
  readonly finishedAt?: number;
  /** The container's exit code once known; null when it can never be known (container vanished). */
  readonly exitCode?: number | null;
  /**
   * Its task.json has a newer format than this shim understands: shown read-only, never
   * persisted, released, terminated or removed by this version.
   */
  readonly foreign?: boolean;
  /**
   * Restored from its container alone (no readable state file): its config, and so its host
   * keys and volumes, are unknown.
   */
  readonly degraded?: boolean;
  /** Restored from a state file written before the host's last reboot. */
  readonly acrossReboot?: boolean;
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
    containerId: "",
    ports: null,
    gpuIds: [],
    pullProgress: null,
    taskDir: "",
    cleanedUp: false,
    startInFlight: false,
    createdAt: Date.now(),
  };
}
