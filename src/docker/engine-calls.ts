/*
 * How the adapter makes an Engine API call: under a deadline, counted by operation with its
 * duration, its error mapped to a typed one. Every family of calls (`engine-system.ts`,
 * `engine-containers.ts`, `engine-images.ts`, `engine-streams.ts`) goes through one
 * {@link EngineCalls}.
 */
import type Docker from "dockerode";
import { withDeadline } from "../exec/deadline-signal.js";
import { REMOVAL_TIMEOUT_MS } from "./confirmed-removal.js";
import { LABEL_IS_TASK } from "./docker-client.js";
import { mapDockerError } from "./docker-errors.js";

/** Deadlines (ms) for the short Engine API calls. */
export const DOCKER_DEADLINES = {
  ping: 3_000,
  /** `GET /version`: which engine this is (Podman runs conmon and its runtime to answer). */
  version: 5_000,
  /** `GET /info`: the storage root (service mode's host_info.json). */
  info: 10_000,
  list: 10_000,
  inspect: 10_000,
  create: 60_000,
  start: 60_000,
  /** Added to the stop timeout the caller gives the container. */
  stopExtra: 15_000,
  /** Podman only: how long a stop waits for its `stopping` status to end (its exit-file wait is 5 s). */
  stopSettle: 6_000,
  /** The whole confirmed removal, polling included (`REMOVAL_TIMEOUT_MS`). */
  remove: REMOVAL_TIMEOUT_MS,
  logs: 10_000,
  image: 10_000,
} as const;

/** The label filter of every list and event call: shim task containers only. */
export const TASK_FILTER = { label: [`${LABEL_IS_TASK}=true`] };

/**
 * Counts Engine API calls by operation, with how long each took (seconds; for a stream, until
 * its answer began), so the reconciler's cost and the engine's latency are visible.
 */
export type DockerCallCounter = (operation: string, outcome: "ok" | "error", seconds: number) => void;

/** Seconds since `start` (a `process.hrtime.bigint()`), on the monotonic clock. */
export const since = (start: bigint): number => Number(process.hrtime.bigint() - start) / 1e9;

/**
 * dockerode's client with the counter every call reports to. No global docker-modem timeout is
 * set: it is a socket-idle timeout that would kill legitimate long polls.
 */
export class EngineCalls {
  constructor(
    readonly docker: Docker,
    private readonly count: DockerCallCounter,
  ) {}

  /** A short call: under `timeoutMs` (and `signal`), counted, its error mapped. */
  async call<T>(
    operation: string,
    timeoutMs: number,
    signal: AbortSignal | undefined,
    fn: (signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    return this.counted(operation, () => withDeadline(signal, timeoutMs, fn));
  }

  /**
   * A call with no deadline of its own (a stream, ended by its caller's signal; a create, bounded
   * by its own late-answer rules): counted until it answers, its error mapped.
   */
  async counted<T>(operation: string, fn: () => Promise<T>): Promise<T> {
    const start = process.hrtime.bigint();
    try {
      const result = await fn();
      this.count(operation, "ok", since(start));
      return result;
    } catch (error) {
      this.count(operation, "error", since(start));
      throw mapDockerError(error, operation);
    }
  }

  /** Counts an operation the caller timed itself (`since`) and whose errors are its own. */
  note(operation: string, outcome: "ok" | "error", seconds: number): void {
    this.count(operation, outcome, seconds);
  }
}
