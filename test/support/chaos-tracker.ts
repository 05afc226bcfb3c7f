/*
 * The chaos tracker's books: what the test programmed each task's workload to do and every
 * fault it caused, and the views of the host the oracle (chaos-oracle.ts) judges them against.
 * The books never hold the shim's word, only what the test did and saw.
 */

/**
 * What a task's workload was programmed to do, recorded by the test when it builds the task:
 * exit with `code` once the test sends `go` (the default workload) or on its own, be killed by
 * the kernel for its memory limit (`oom`: exit 137), or run until it is told to stop.
 */
export type Fate =
  | { readonly kind: "exits"; readonly code: number; readonly trigger: "go" | "self"; readonly oom?: boolean }
  | { readonly kind: "runs-until-told" };

/** A submit body the suite sends (a dstack-shim TaskConfig plus taskshim's `command`). */
export interface ChaosTaskConfig {
  readonly id: string;
  readonly name: string;
  readonly image_name: string;
  readonly command?: readonly string[];
  readonly gpu?: number;
  readonly memory?: number;
  readonly host_ssh_user?: string;
  readonly host_ssh_keys?: readonly string[];
  readonly volumes?: readonly Record<string, unknown>[];
  readonly registry_username?: string;
  readonly registry_password?: string;
}

/** What the tracker knows about one task. */
export interface TrackedTask {
  readonly config: ChaosTaskConfig;
  readonly containerName: string;
  /** A submit was answered 200, or the shim listed the task. */
  answered: boolean;
  removed: "no" | "yes" | "maybe";
  terminateRequested: boolean;
  /** Its task.json was quarantined: the shim cannot know its keys or volumes. */
  degraded: boolean;
  maxRank: number;
  terminal?: { readonly reason: string; readonly message: string };
  containerId?: string;
  /** Seen terminated with an exit-based reason while its container still told the same. */
  exitConfirmed: boolean;
  /** A remove was sent (maybe cut by a kill): its container may be gone for a good reason. */
  removeAttempted: boolean;
  // ---- the tracker's own books: what the test programmed and caused, never the shim's word
  /** What the workload was programmed to do. */
  readonly fate: Fate;
  /** The test created `runner/go` (the default workload then exits with its code). */
  goSent: boolean;
  /** Every termination reason a terminate of this task asked for. */
  readonly terminateReasons: Set<string>;
  /** The test itself removed the task's container (`docker rm -f` from outside). */
  containerRemovedByTest: boolean;
  /** How many times the test itself restarted the task's container. */
  restartsByTest: number;
  /** The test's simulated host reboot killed the task's running container (SIGKILL: exit 137). */
  killedByReboot: boolean;
  /** Every container id seen for the task, from the API and from Docker. */
  readonly containerIds: Set<string>;
  /** A container of the task ran (seen running, started, or the workload recorded a start). */
  ran: boolean;
  /** Violations already counted for this task (each rule counts once per task). */
  readonly flagged: Set<string>;
}

/** A scenario container as Docker reports it. */
export interface ChaosContainer {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
  readonly state: string;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  readonly startedAt: string;
  readonly restartCount: number;
  readonly gpuDevices: readonly string[];
}

/** The parsed task.json (the fields the oracle reads). */
export interface ChaosTaskState {
  readonly status?: string;
  readonly termination_reason: string;
  readonly termination_message: string;
  readonly cleaned_up: boolean;
  readonly exit_code?: number | null;
  readonly [key: string]: unknown;
}

/** A fresh entry of the books for a task about to be submitted. */
export function newTrackedTask(config: ChaosTaskConfig, containerName: string, fate: Fate): TrackedTask {
  return {
    config,
    containerName,
    answered: false,
    removed: "no",
    terminateRequested: false,
    degraded: false,
    maxRank: -1,
    exitConfirmed: false,
    removeAttempted: false,
    fate,
    goSent: false,
    terminateReasons: new Set(),
    containerRemovedByTest: false,
    restartsByTest: 0,
    killedByReboot: false,
    containerIds: new Set(),
    ran: false,
    flagged: new Set(),
  };
}
