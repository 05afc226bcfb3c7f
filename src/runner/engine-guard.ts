/*
 * A home is bound to the engine its containers live on (state/engine-record.ts). The start refuses
 * another engine (shim/startup-steps.ts); this guard keeps a running shim honest when the engine changes
 * under it (Docker stopped and Podman served on the same socket, a DOCKER_HOST pointed elsewhere):
 * an answer that a container is gone is believed only from the bound engine. Every destructive
 * step of the lifecycle (finalize "container not found", release, delete the task dir, a fence's
 * "removed") starts from such an answer, so none of them runs against the wrong engine; and no
 * container is created there.
 */
import type { Logger } from "pino";
import type { Readable } from "node:stream";
import type {
  ContainerSpec,
  ContainerDetails,
  ContainerEvent,
  DockerClient,
  PullAuth,
  RemovalConfirmed,
  TaskContainerSummary,
} from "../docker/docker-client.js";
import {
  describeEngine,
  sameEngine,
  type EngineFingerprint,
  type EngineFingerprintSource,
} from "../docker/engine-fingerprint.js";
import { errorMessage } from "../errors/error-message.js";

/** The engine answering is not the one this home's containers live on. */
export class EngineMismatchError extends Error {
  override readonly name = "EngineMismatchError";
}

/** What the guard knows of the engine, as the healthcheck shows it. */
export type EngineBindingState =
  | { readonly state: "unbound" }
  | { readonly state: "bound"; readonly engine: EngineFingerprint }
  | {
      readonly state: "mismatch";
      readonly engine: EngineFingerprint;
      /** What answers instead, when it could be read. */
      readonly seen: EngineFingerprint | undefined;
      /** Monotonic ms (performance.now()) of when the mismatch was found. */
      readonly sinceMono: number;
      /** Wall-clock ms, for the user-facing `since`. */
      readonly since: number;
      readonly why: string;
    };

/** A verification this recent (ms, monotonic) is reused for a create. */
const VERIFIED_FOR_MS = 1_000;

/**
 * The binding's runtime side. `bind` records a fingerprint for a home that has none (the first
 * container); `verify` reads the engine again and compares it with the bound one.
 */
export class EngineGuard {
  private current: EngineBindingState;
  private verifiedAt = Number.NEGATIVE_INFINITY;
  private inFlight: Promise<void> | undefined;

  constructor(
    private readonly source: EngineFingerprintSource,
    bound: EngineFingerprint | undefined,
    private readonly record: (engine: EngineFingerprint) => Promise<void>,
    private readonly log: Logger,
  ) {
    this.current = bound === undefined ? { state: "unbound" } : { state: "bound", engine: bound };
  }

  /** The binding as last verified. */
  state(): EngineBindingState {
    return this.current;
  }

  /** Whether the engine answering is known not to be the bound one. */
  mismatched(): boolean {
    return this.current.state === "mismatch";
  }

  /** The engine was seen down: the next create verifies again before it runs. */
  engineDown(): void {
    this.verifiedAt = Number.NEGATIVE_INFINITY;
  }

  /**
   * Throws unless the engine answering is the bound one (binding it first if the home has no
   * binding yet). One read at a time; a verification under a second old is reused when `fresh`
   * is not asked for.
   *
   * @throws EngineMismatchError, or the engine's own error when it cannot be read.
   */
  async verify(signal?: AbortSignal, fresh = true): Promise<void> {
    if (!fresh && this.current.state === "bound" && performance.now() - this.verifiedAt < VERIFIED_FOR_MS)
      return;
    this.inFlight ??= this.read(signal).finally(() => (this.inFlight = undefined));
    await this.inFlight;
    if (this.current.state === "mismatch") throw new EngineMismatchError(this.current.why);
  }

  private async read(signal: AbortSignal | undefined): Promise<void> {
    const seen = await this.source.fingerprint(signal);
    const before = this.current;
    if (before.state === "unbound") {
      await this.record(seen);
      this.current = { state: "bound", engine: seen };
      this.log.info({ engine: describeEngine(seen) }, "this home is bound to its engine");
    } else if (sameEngine(before.engine, seen)) {
      if (before.state === "mismatch") {
        this.log.info(
          { engine: describeEngine(seen) },
          "this home's engine answers again; reconciling resumes",
        );
      }
      this.current = { state: "bound", engine: before.engine };
    } else if (before.state === "bound") {
      const why = `the engine answering is ${describeEngine(seen)}, not this home's ${describeEngine(before.engine)}: tasks keep their status until it answers again`;
      this.current = {
        state: "mismatch",
        engine: before.engine,
        seen,
        sinceMono: performance.now(),
        since: Date.now(),
        why,
      };
      this.log.error(
        { engine: describeEngine(before.engine), seen: describeEngine(seen) },
        "the engine changed under the shim; nothing is finalized, released or removed",
      );
    }
    this.verifiedAt = performance.now();
  }
}

/**
 * The Engine API port behind the guard: an answer that a container is absent (an inspect that
 * finds nothing, a removal that finds it gone) is returned only once the engine is verified to be
 * the bound one, and a create only runs on it. Everything else passes through untouched (a list
 * on another engine simply lists none of this home's containers; what the lifecycle does with a
 * missing one goes through an inspect).
 */
export class GuardedDockerClient implements DockerClient {
  constructor(
    private readonly inner: DockerClient,
    private readonly guard: EngineGuard,
  ) {}

  ping(signal?: AbortSignal): Promise<void> {
    return this.inner.ping(signal);
  }

  listTaskContainers(signal?: AbortSignal): Promise<TaskContainerSummary[]> {
    return this.inner.listTaskContainers(signal);
  }

  async inspectContainer(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined> {
    const details = await this.inner.inspectContainer(idOrName, signal);
    if (details === undefined) await this.confirmAbsence(signal);
    return details;
  }

  async createContainer(spec: ContainerSpec, signal?: AbortSignal): Promise<string> {
    await this.guard.verify(signal, false);
    return this.inner.createContainer(spec, signal);
  }

  startContainer(id: string, signal?: AbortSignal): Promise<void> {
    return this.inner.startContainer(id, signal);
  }

  stopContainer(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void> {
    return this.inner.stopContainer(id, timeoutSeconds, signal);
  }

  async removeContainer(id: string, signal?: AbortSignal): Promise<RemovalConfirmed> {
    const outcome = await this.inner.removeContainer(id, signal);
    if (outcome === "already-absent") await this.confirmAbsence(signal);
    return outcome;
  }

  containerLogTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]> {
    return this.inner.containerLogTail(id, lines, signal);
  }

  imageExists(reference: string, signal?: AbortSignal): Promise<boolean> {
    return this.inner.imageExists(reference, signal);
  }

  pullImage(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable> {
    return this.inner.pullImage(reference, auth, signal);
  }

  containerEvents(signal: AbortSignal): AsyncIterable<ContainerEvent> {
    return this.inner.containerEvents(signal);
  }

  /** An absence is believed only from the bound engine (a home with none yet has nothing to compare). */
  private async confirmAbsence(signal: AbortSignal | undefined): Promise<void> {
    if (this.guard.state().state === "unbound") return;
    try {
      await this.guard.verify(signal);
    } catch (error) {
      if (error instanceof EngineMismatchError) throw error;
      throw new EngineMismatchError(
        `cannot confirm the engine before believing an absence: ${errorMessage(error)}`,
        {
          cause: error,
        },
      );
    }
  }
}
