/*
 * The container calls of the Engine API adapter: list, inspect, create (with its late answers),
 * start, stop and the confirmed removal.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { errorMessage } from "../errors/error-message.js";
import { OperationBound } from "../exec/operation-bound.js";
import { containerDetailsOf, containerSummaryOf } from "./container-answers.js";
import {
  confirmRemoval,
  type InspectAnswer,
  type RemovalChannel,
  type RemoveAnswer,
} from "./confirmed-removal.js";
import {
  LABEL_CDI_DEVICES,
  type ContainerDetails,
  type ContainerSpec,
  type RemovalConfirmed,
  type TaskContainerSummary,
} from "./docker-client.js";
import { DockerConflictError, DockerNotFoundError } from "./docker-errors.js";
import { DOCKER_DEADLINES, since, TASK_FILTER, type EngineCalls } from "./engine-calls.js";
import { engineCreateBody } from "./engine-create-body.js";
import type { EngineInfo } from "./engine-info.js";
import type { EngineSystem } from "./engine-system.js";
import { gpuRequestsForEngine } from "./gpu-devices.js";
import { createUnderDeadline } from "./late-create.js";

/**
 * How long a create that missed its deadline may still run before it is aborted after all: an
 * engine that answers it within this is told to remove what it created.
 */
export const LATE_CREATE_BOUND_MS = 10 * 60_000;

/** How often a stop looks again at a Podman container still `stopping`. */
const STOP_SETTLE_POLL_MS = 50;

/** The deadlines a test may shorten; production uses the defaults. */
export interface ContainerCallTimeouts {
  /** The confirmed removal's deadline (the seed's 30 s). */
  readonly removalMs: number;
  /** The create's deadline ({@link DOCKER_DEADLINES}.create). */
  readonly createMs: number;
}

/**
 * `spec` as `engine` takes it. The one place a create differs by engine: GPUs go to Podman as
 * CDI devices, recorded in a label ({@link LABEL_CDI_DEVICES}) since Podman's inspect does not
 * report them.
 *
 * @throws EngineGpuUnsupportedError when the engine cannot give the container its GPUs.
 */
export function specForEngine(spec: ContainerSpec, engine: EngineInfo): ContainerSpec {
  const translated = gpuRequestsForEngine(spec.gpuRequests, engine);
  if (translated.cdiDevices.length === 0) return spec;
  return {
    ...spec,
    labels: { ...spec.labels, [LABEL_CDI_DEVICES]: translated.cdiDevices.join(",") },
    gpuRequests: translated.gpuRequests,
  };
}

/** List, inspect, create, start, stop and remove over one {@link EngineCalls}. */
export class EngineContainers {
  /** Creates that missed their deadline and still run, each with the removal of what it made. */
  private readonly lateCreates = new Set<Promise<void>>();

  constructor(
    private readonly calls: EngineCalls,
    private readonly system: EngineSystem,
    private readonly timeouts: ContainerCallTimeouts,
  ) {}

  /** The task containers (labelled), running or not. */
  async list(signal?: AbortSignal): Promise<TaskContainerSummary[]> {
    const containers = await this.calls.call("list", DOCKER_DEADLINES.list, signal, (abortSignal) =>
      this.calls.docker.listContainers({ all: true, filters: TASK_FILTER, abortSignal }),
    );
    return containers.map(containerSummaryOf);
  }

  /** Inspects a container by id or name; `undefined` if it does not exist. */
  async inspect(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined> {
    try {
      const info = await this.calls.call("inspect", DOCKER_DEADLINES.inspect, signal, (abortSignal) =>
        this.calls.docker.getContainer(idOrName).inspect({ abortSignal }),
      );
      return containerDetailsOf(info);
    } catch (error) {
      if (error instanceof DockerNotFoundError) return undefined;
      throw error;
    }
  }

  /**
   * Creates a container. Past its deadline the caller hears a deadline error at once, but the
   * request is not aborted: the engine may create the container all the same, and only its answer
   * names it. When that answer arrives, the container is removed (a confirmed removal), so a
   * start that gave up leaves no orphan behind (`late-create.ts`). Only a spec with GPU requests
   * needs to know the engine (detected now if it is not known yet).
   */
  async create(spec: ContainerSpec, signal?: AbortSignal): Promise<string> {
    const engineSpec =
      spec.gpuRequests.length === 0 ? spec : specForEngine(spec, await this.system.known(signal));
    const body = engineCreateBody(engineSpec);
    const create = createUnderDeadline(
      (abortSignal) => this.calls.docker.createContainer({ ...body, name: spec.name, abortSignal }),
      {
        timeoutMs: this.timeouts.createMs,
        lateBoundMs: Math.max(LATE_CREATE_BOUND_MS, this.timeouts.createMs),
        parent: signal,
        onLate: (container) => this.removeLateCreate(container.id),
      },
    );
    const settled = create.settled.finally(() => this.lateCreates.delete(settled));
    this.lateCreates.add(settled);
    const container = await this.calls.counted("create", () => create.answer);
    return container.id;
  }

  /** Removes a container whose create answered after its deadline (nobody else knows its id). */
  private async removeLateCreate(id: string): Promise<void> {
    const start = process.hrtime.bigint();
    try {
      // Not under the shutdown's signal: the removal is bounded by its own 30 s.
      await this.remove(id);
      this.calls.note("late_create_remove", "ok", since(start));
    } catch {
      this.calls.note("late_create_remove", "error", since(start));
    }
  }

  /**
   * Settles once every create that missed its deadline has ended and what it created was
   * removed (or its removal failed).
   */
  async lateCreatesSettled(): Promise<void> {
    while (this.lateCreates.size > 0) await Promise.all([...this.lateCreates]);
  }

  /** Starts a container; one already running is fine. */
  async start(id: string, signal?: AbortSignal): Promise<void> {
    try {
      await this.calls.call("start", DOCKER_DEADLINES.start, signal, (abortSignal) =>
        this.calls.docker.getContainer(id).start({ abortSignal }),
      );
    } catch (error) {
      // 304: already started, which is what we asked for.
      if ((error as { statusCode?: number }).statusCode === 304) return;
      throw error;
    }
  }

  /**
   * Stops a container (SIGTERM, SIGKILL after `timeoutSeconds`); a stopped or missing one is
   * fine. On Podman it answers once the container's exit code can be read.
   */
  async stop(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void> {
    const deadline = timeoutSeconds * 1000 + DOCKER_DEADLINES.stopExtra;
    try {
      await this.calls.call("stop", deadline, signal, (abortSignal) =>
        this.calls.docker.getContainer(id).stop({ t: timeoutSeconds, abortSignal }),
      );
    } catch (error) {
      const status = (error as { statusCode?: number }).statusCode;
      // 304: not running; 404: gone. Both mean "stopped".
      if (error instanceof DockerNotFoundError) return;
      if (status !== 304) throw error;
    }
    if (this.system.engine?.kind === "podman") await this.settlePodmanStop(id, signal);
  }

  /**
   * Waits out Podman's `stopping` status after a stop answered: a stop that finds another stop
   * (or the container's own exit) under way answers before the exit code is read, and an inspect
   * meanwhile reports `stopping` with exit code 0 (`containerStateOf`). Docker answers a stop
   * only once the container has stopped, so this is Podman's alone. Bounded by
   * {@link DOCKER_DEADLINES}.stopSettle; past it the caller sees the container as still running,
   * and the reconciler reads the exit later.
   */
  private async settlePodmanStop(id: string, signal?: AbortSignal): Promise<void> {
    const until = performance.now() + DOCKER_DEADLINES.stopSettle;
    while (performance.now() < until && !signal?.aborted) {
      const info = await this.calls
        .call("inspect", DOCKER_DEADLINES.inspect, signal, (abortSignal) =>
          this.calls.docker.getContainer(id).inspect({ abortSignal }),
        )
        .catch(() => undefined);
      if (info?.State.Status !== "stopping") return;
      await sleep(STOP_SETTLE_POLL_MS, undefined, { signal }).catch(() => undefined);
    }
  }

  /** The seed's confirmed removal over the Engine API, within one 30 s deadline ({@link confirmRemoval}). */
  async remove(id: string, signal?: AbortSignal): Promise<RemovalConfirmed> {
    return confirmRemoval(this.removalChannel(signal), id, OperationBound.within(this.timeouts.removalMs));
  }

  /** The Engine API as a removal channel; each call is capped by what is left of the bound. */
  private removalChannel(signal: AbortSignal | undefined): RemovalChannel {
    return {
      remove: async (id, bound): Promise<RemoveAnswer> => {
        const left = bound.remainingMs() ?? this.timeouts.removalMs;
        if (left === 0)
          return {
            kind: "failed",
            reason: { kind: "deadline", elapsedMs: bound.elapsedMs(), cleanup: null },
          };
        try {
          await this.calls.call("remove", left, signal, (abortSignal) =>
            this.calls.docker.getContainer(id).remove({ force: true, v: true, abortSignal }),
          );
          return { kind: "removed" };
        } catch (error) {
          if (error instanceof DockerNotFoundError) return { kind: "absent" };
          if (error instanceof DockerConflictError && /already in progress/i.test(error.message)) {
            return { kind: "in-progress" };
          }
          if (signal?.aborted)
            return { kind: "failed", reason: { kind: "wait", detail: "container cleanup was interrupted" } };
          if (bound.expired()) {
            return {
              kind: "failed",
              reason: { kind: "deadline", elapsedMs: bound.elapsedMs(), cleanup: null },
            };
          }
          return { kind: "failed", reason: { kind: "engine", detail: errorMessage(error) } };
        }
      },
      inspect: async (id, bound): Promise<InspectAnswer> => {
        const left = Math.min(bound.remainingMs() ?? DOCKER_DEADLINES.inspect, DOCKER_DEADLINES.inspect);
        try {
          await this.calls.call("inspect", left, signal, (abortSignal) =>
            this.calls.docker.getContainer(id).inspect({ abortSignal }),
          );
        } catch (error) {
          if (error instanceof DockerNotFoundError) return { kind: "absent" };
        }
        // Still there, or an answer that proves nothing: the deadline decides.
        return { kind: "unknown", cleanup: null };
      },
    };
  }
}
