import type { Logger } from "pino";
import type { ContainerParams } from "../docker/container-spec.js";
import type { DockerClient } from "../docker/docker-client.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import type { GpuLock } from "../host/gpu-lock.js";
import type { HostKeysReconciler } from "../host/authorized-keys.js";
import type { HostVolumes } from "../host/volumes.js";
import type { StorageHealth } from "../state/storage-health.js";
import type { TaskDirs } from "../state/task-dirs.js";
import type { TaskStore } from "../tasks/task-store.js";
import type { ContainerOwnership } from "./ownership.js";
import type { EngineGuard } from "./engine-guard.js";

/** Everything the lifecycle engine talks to; each external system behind its own port. */
export interface RunnerContext {
  readonly docker: DockerClient;
  readonly store: TaskStore;
  readonly dirs: TaskDirs;
  readonly inventory: GpuInventory;
  readonly gpuLock: GpuLock;
  readonly hostKeys: HostKeysReconciler;
  readonly volumes: HostVolumes;
  readonly params: ContainerParams;
  /** Which labelled containers are this shim's (the one ownership rule). */
  readonly ownership: ContainerOwnership;
  readonly bootId: string;
  readonly log: Logger;
  /** Aborted when the shim shuts down: long operations (pulls) end through it. */
  readonly shutdown: AbortSignal;
  /** The home's storage health: failed durable writes mark it degraded; optional. */
  readonly storage?: StorageHealth;
  /**
   * The home's engine binding: while the engine answering is not the bound one, the reconciler
   * acts on nothing (runner/engine-guard.ts); optional (tests without a real engine).
   */
  readonly engineGuard?: EngineGuard;
  /** Receives lifecycle facts for metrics; optional. */
  readonly observer?: RunnerObserver;
}

/** Lifecycle facts the engine reports (to metrics), kept free of any metrics library. */
export interface RunnerObserver {
  taskStarted(): void;
  taskFinalized(reason: string): void;
  tickDone(seconds: number): void;
  engineSeen(up: boolean): void;
  pulledBytes(bytes: number): void;
}

/** Lines of container log kept as the termination message of a failed task. */
export const LAST_LOG_LINES = 5;
/** Upper bound of one image pull (dstack-shim's ImagePullTimeout). */
export const IMAGE_PULL_TIMEOUT_MS = 20 * 60 * 1000;
