import type { Readable } from "node:stream";
import type { PortMapping } from "../tasks/task-parts.js";

/** Container label marking shim tasks (shared with dstack-shim). */
export const LABEL_IS_TASK = "ai.dstack.shim.is-task";
/** Container label carrying the task id (shared with dstack-shim). */
export const LABEL_TASK_ID = "ai.dstack.shim.task-id";
/**
 * taskshim's own label beside dstack's two: the identity of the home whose shim created the
 * container. Containers of another home on the same engine are never acted on.
 */
export const LABEL_OWNER = "ai.dstack.taskshim.owner";
/**
 * taskshim's label on a Podman container given GPUs through CDI: their CDI names, comma-separated.
 * Podman's inspect reports neither device requests nor CDI devices, so a restart reads them here.
 */
export const LABEL_CDI_DEVICES = "ai.dstack.taskshim.cdi-devices";

/** Docker's container states. */
export type ContainerState = "created" | "running" | "paused" | "restarting" | "removing" | "exited" | "dead";

/** One labelled container from a list call. */
export interface TaskContainerSummary {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
  /** The owner label ({@link LABEL_OWNER}); "" when the container has none. */
  readonly owner: string;
  readonly state: ContainerState;
  /**
   * Host port bindings (tcp, IPv4) as the list reports them, the same as an inspect's; absent
   * when the client does not list them (a restore then inspects for them).
   */
  readonly ports?: readonly PortMapping[];
}

/** A mount of a container, as an inspect reports it. */
export interface ContainerMount {
  readonly source: string;
  readonly destination: string;
}

/** What the shim reads from a container inspect. */
export interface ContainerDetails {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
  /** The owner label ({@link LABEL_OWNER}); "" when the container has none. */
  readonly owner: string;
  readonly state: ContainerState;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  readonly error: string;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly restartCount: number;
  readonly ports: PortMapping[];
  /** Its mounts (bind and volume), for recovering the volumes of a container without state. */
  readonly mounts: readonly ContainerMount[];
  readonly hostConfig: {
    readonly DeviceRequests?: { Driver?: string; DeviceIDs?: string[] }[] | null;
    readonly Devices?: { PathOnHost?: string; PathInContainer?: string }[] | null;
  };
  /** Its environment, `NAME=value` (Gaudi's accelerator indices are read back from it); absent when not read. */
  readonly env?: readonly string[];
}

/**
 * An inspect's `StartedAt` or `FinishedAt` as epoch ms; undefined when it tells no time: not a
 * date, or Docker's zero time (year 1) of a container that never started or finished.
 */
export function engineTime(value: string | undefined): number | undefined {
  const ms = Date.parse(value ?? "");
  return ms > 0 ? ms : undefined;
}

/** Registry credentials for a pull. */
export interface PullAuth {
  readonly username: string;
  readonly password: string;
  readonly serveraddress: string;
}

/** A container event from the engine's event stream (only the fields the shim uses). */
export interface ContainerEvent {
  readonly action: string;
  readonly containerId: string;
  readonly taskId: string;
  /** The owner label ({@link LABEL_OWNER}); "" when the container has none. */
  readonly owner: string;
  /** A `die` event's `exitCode` attribute: the workload's exit code, as inspect would report it. */
  readonly exitCode?: number;
}

/** A host path bound into the container. */
export interface BindMount {
  readonly source: string;
  readonly target: string;
}

/** A host device node given to the container. */
export interface DeviceMapping {
  readonly pathOnHost: string;
  readonly pathInContainer: string;
  /** The device cgroup's access, `rwm` for every device the shim passes. */
  readonly cgroupPermissions: string;
}

/** A request for GPUs by id: NVIDIA's (no driver), or CDI devices by name (driver `cdi`). */
export interface GpuRequest {
  readonly driver?: string;
  readonly deviceIds: readonly string[];
  /** Alternative capability sets; an empty list asks for none (a CDI request). */
  readonly capabilities: readonly (readonly string[])[];
}

/**
 * A container as the shim decides it, in the shim's terms: what the create asks the engine for.
 * The adapter turns it into the Engine API's create body; a field at its zero value asks for
 * nothing (the engine's default). The restart policy is always "no" and the container is never
 * auto-removed: its exit code must outlive the shim, so neither is a choice here.
 */
export interface ContainerSpec {
  readonly name: string;
  readonly image: string;
  /** The program and its arguments (the image's own are never used). */
  readonly entrypoint: readonly string[];
  readonly cmd: readonly string[];
  /** `NAME=value`, in order. */
  readonly env: readonly string[];
  readonly user: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly networkMode: "host" | "bridge";
  /** Container ports (tcp) the image exposes. */
  readonly exposedPorts: readonly number[];
  /** Container ports (tcp) published on 127.0.0.1 at a host port the engine picks. */
  readonly publishedPorts: readonly number[];
  readonly privileged: boolean;
  /** Bind mounts, in order. */
  readonly mounts: readonly BindMount[];
  readonly devices: readonly DeviceMapping[];
  readonly gpuRequests: readonly GpuRequest[];
  readonly capAdd: readonly string[];
  readonly securityOpt: readonly string[];
  /** The IPC namespace (`host`); absent: the engine's default. */
  readonly ipcMode?: string;
  /** The OCI runtime registered with the engine (Gaudi's `habana`); absent: the engine's default. */
  readonly runtime?: string;
  /** Bytes of an exec-able `/dev/shm`; 0: the engine's default. */
  readonly shmSize: number;
  /** CPUs, possibly fractional; 0: no limit. */
  readonly cpus: number;
  /** Bytes of memory; 0: no limit. */
  readonly memory: number;
  /** Lift the locked-memory limit (RDMA over InfiniBand pins its buffers). */
  readonly memlockUnlimited: boolean;
}

/** The result of a removal that reached a confirmed end. */
export type RemovalConfirmed = "removed" | "already-absent";

/**
 * The port to the Docker Engine. Every method takes a signal: the adapter adds its own
 * deadline for short calls, and long calls (pull, events) end only through the signal.
 */
export interface DockerClient {
  ping(signal?: AbortSignal): Promise<void>;
  listTaskContainers(signal?: AbortSignal): Promise<TaskContainerSummary[]>;
  /** Inspects a container by id or name; `undefined` if it does not exist. */
  inspectContainer(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined>;
  createContainer(spec: ContainerSpec, signal?: AbortSignal): Promise<string>;
  startContainer(id: string, signal?: AbortSignal): Promise<void>;
  /** Stops a container (SIGTERM, SIGKILL after `timeoutSeconds`); a stopped or missing one is fine. */
  stopContainer(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void>;
  /** Removes a container and confirms it is gone; throws `RemovalUnconfirmedError` otherwise. */
  removeContainer(id: string, signal?: AbortSignal): Promise<RemovalConfirmed>;
  /** The last `lines` lines of stdout and stderr, interleaved as Docker stored them. */
  containerLogTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]>;
  imageExists(reference: string, signal?: AbortSignal): Promise<boolean>;
  /** Starts a pull; the returned stream is the engine's NDJSON progress. */
  pullImage(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable>;
  /** Follows container events of shim tasks until the signal aborts or the stream drops. */
  containerEvents(signal: AbortSignal): AsyncIterable<ContainerEvent>;
}
