import { fingerprintOf, type EngineFingerprint, type EngineFingerprintSource } from "./engine-fingerprint.js";
import type { EngineStorageRoot } from "../host/host-info.js";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import type { Readable } from "node:stream";
import Docker from "dockerode";
import { withDeadline } from "../exec/deadline-signal.js";
import { createUnderDeadline } from "./late-create.js";
import { OperationBound } from "../exec/operation-bound.js";
import {
  LABEL_CDI_DEVICES,
  LABEL_IS_TASK,
  LABEL_OWNER,
  LABEL_TASK_ID,
  type ContainerDetails,
  type ContainerEvent,
  type ContainerSpec,
  type DockerClient,
  type PullAuth,
  type RemovalConfirmed,
  type TaskContainerSummary,
} from "./docker-client.js";
import {
  parseEngineVersion,
  type EngineDetection,
  type EngineInfo,
  type EngineVersionSource,
} from "./engine-info.js";
import { engineCreateBody } from "./engine-create-body.js";
import { gpuRequestsForEngine } from "./gpu-devices.js";
import { completePodmanPull, containerStateOf } from "./podman-compat.js";
import type { PortMapping } from "../tasks/task-parts.js";
import {
  confirmRemoval,
  REMOVAL_TIMEOUT_MS,
  type InspectAnswer,
  type RemovalChannel,
  type RemoveAnswer,
} from "./confirmed-removal.js";
import { DockerConflictError, DockerNotFoundError, mapDockerError } from "./docker-errors.js";
import { errorMessage } from "../errors/error-message.js";
import {
  LOG_TAIL_FIRST_ENTRIES,
  LOG_TAIL_MAX_BYTES,
  LogTailCollector,
  nextLogTailEntries,
} from "./log-tail.js";

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

/**
 * How long a create that missed its deadline may still run before it is aborted after all: an
 * engine that answers it within this is told to remove what it created.
 */
export const LATE_CREATE_BOUND_MS = 10 * 60_000;

/** How often {@link DockerodeClient} looks again at a Podman container still `stopping`. */
const STOP_SETTLE_POLL_MS = 50;

const TASK_FILTER = { label: [`${LABEL_IS_TASK}=true`] };

/**
 * Counts Engine API calls by operation, with how long each took (seconds; for a stream, until
 * its answer began), so the reconciler's cost and the engine's latency are visible.
 */
export type DockerCallCounter = (operation: string, outcome: "ok" | "error", seconds: number) => void;

const since = (start: bigint): number => Number(process.hrtime.bigint() - start) / 1e9;

/**
 * The one adapter from the `DockerClient` port to the Engine API (dockerode). It adds a
 * deadline to every short call and maps errors to typed ones. No global docker-modem timeout
 * is set: it is a socket-idle timeout that would kill legitimate long polls.
 */
export class DockerodeClient
  implements DockerClient, EngineVersionSource, EngineStorageRoot, EngineFingerprintSource
{
  private readonly docker: Docker;
  /** The engine as last detected: a create with GPUs is translated for it (`specForEngine`). */
  private engine: EngineInfo | undefined;
  /** Creates that missed their deadline and still run, each with the removal of what it made. */
  private readonly lateCreates = new Set<Promise<void>>();

  constructor(
    options: { socketPath?: string; host?: string; port?: number; protocol?: "http" | "https" } = {},
    private readonly count: DockerCallCounter = () => undefined,
    /** The confirmed removal's deadline (the seed's 30 s; shorter only in tests). */
    private readonly removalTimeoutMs = REMOVAL_TIMEOUT_MS,
    /** The create's deadline ({@link DOCKER_DEADLINES}.create; shorter only in tests). */
    private readonly createTimeoutMs: number = DOCKER_DEADLINES.create,
  ) {
    this.docker = new Docker(options);
  }

  /** Builds a client from DOCKER_HOST (unix:// or tcp://) or the default socket. */
  static fromEnv(dockerHost = process.env.DOCKER_HOST, count?: DockerCallCounter): DockerodeClient {
    return DockerodeClient.fromUrl(dockerHost ?? "", count);
  }

  /** Builds a client for an engine URL (unix:// or tcp://, as DOCKER_HOST); "" is Docker's socket. */
  static fromUrl(dockerHost: string, count?: DockerCallCounter): DockerodeClient {
    if (!dockerHost) return new DockerodeClient({ socketPath: "/var/run/docker.sock" }, count);
    if (dockerHost.startsWith("unix://")) {
      return new DockerodeClient({ socketPath: dockerHost.slice("unix://".length) }, count);
    }
    const url = new URL(dockerHost.replace(/^tcp:/, "http:"));
    return new DockerodeClient(
      {
        host: url.hostname,
        port: Number(url.port || 2375),
        protocol: url.protocol === "https:" ? "https" : "http",
      },
      count,
    );
  }

  private async call<T>(
    operation: string,
    timeoutMs: number,
    signal: AbortSignal | undefined,
    fn: (signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    const start = process.hrtime.bigint();
    try {
      const result = await withDeadline(signal, timeoutMs, fn);
      this.count(operation, "ok", since(start));
      return result;
    } catch (error) {
      this.count(operation, "error", since(start));
      throw mapDockerError(error, operation);
    }
  }

  async ping(signal?: AbortSignal): Promise<void> {
    // @types/dockerode lacks ping's options, but dockerode honours `abortSignal` there too.
    const ping = this.docker.ping.bind(this.docker) as unknown as (opts: {
      abortSignal: AbortSignal;
    }) => Promise<unknown>;
    await this.call("ping", DOCKER_DEADLINES.ping, signal, (abortSignal) => ping({ abortSignal }));
  }

  /** `GET /version`, read as which engine this is; the answer is kept for the creates that follow. */
  async detectEngine(signal?: AbortSignal): Promise<EngineDetection> {
    // @types/dockerode lacks version's options, but dockerode honours `abortSignal` there too.
    const version = this.docker.version.bind(this.docker) as unknown as (opts: {
      abortSignal: AbortSignal;
    }) => Promise<unknown>;
    const body = await this.call("version", DOCKER_DEADLINES.version, signal, (abortSignal) =>
      version({ abortSignal }),
    );
    const detection = parseEngineVersion(body);
    this.engine = detection.info;
    return detection;
  }

  /** `GET /info`, as the engine answers it. */
  private async info(signal?: AbortSignal): Promise<unknown> {
    // @types/dockerode lacks info's options, but dockerode honours `abortSignal` there too.
    const info = this.docker.info.bind(this.docker) as unknown as (opts: {
      abortSignal: AbortSignal;
    }) => Promise<unknown>;
    return this.call("info", DOCKER_DEADLINES.info, signal, (abortSignal) => info({ abortSignal }));
  }

  /**
   * Where the engine keeps images and containers (`DockerRootDir`; Podman's compatible answer
   * names its graph root there). Service mode's `disk_size` is measured on it.
   */
  async storageRoot(signal?: AbortSignal): Promise<string> {
    return (await this.fingerprint(signal)).rootDir;
  }

  /** Which engine instance answers here (engine-fingerprint.ts): `/version`'s kind, `/info`'s identity. */
  async fingerprint(signal?: AbortSignal): Promise<EngineFingerprint> {
    const [detection, info] = await Promise.all([this.detectEngine(signal), this.info(signal)]);
    return fingerprintOf(detection.info.kind, info);
  }

  async listTaskContainers(signal?: AbortSignal): Promise<TaskContainerSummary[]> {
    const containers = await this.call("list", DOCKER_DEADLINES.list, signal, (abortSignal) =>
      this.docker.listContainers({ all: true, filters: TASK_FILTER, abortSignal }),
    );
    return containers.map((c) => ({
      id: c.Id,
      name: (c.Names[0] ?? "").replace(/^\//, ""),
      taskId: c.Labels[LABEL_TASK_ID] ?? "",
      owner: c.Labels[LABEL_OWNER] ?? "",
      state: containerStateOf(c.State),
      ports: listedPorts(c.Ports),
    }));
  }

  async inspectContainer(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined> {
    try {
      const info = await this.call("inspect", DOCKER_DEADLINES.inspect, signal, (abortSignal) =>
        this.docker.getContainer(idOrName).inspect({ abortSignal }),
      );
      return {
        id: info.Id,
        name: info.Name.replace(/^\//, ""),
        taskId: info.Config.Labels?.[LABEL_TASK_ID] ?? "",
        owner: info.Config.Labels?.[LABEL_OWNER] ?? "",
        state: containerStateOf(info.State.Status),
        exitCode: info.State.ExitCode,
        oomKilled: info.State.OOMKilled,
        error: info.State.Error,
        startedAt: info.State.StartedAt,
        finishedAt: info.State.FinishedAt,
        restartCount: info.RestartCount,
        ports: extractPorts(info.NetworkSettings.Ports),
        mounts: (info.Mounts ?? []).map((m) => ({ source: m.Source, destination: m.Destination })),
        hostConfig: {
          DeviceRequests: deviceRequestsOf(
            info.HostConfig.DeviceRequests,
            info.Config.Labels?.[LABEL_CDI_DEVICES],
          ),
          Devices: (info.HostConfig.Devices ?? null) as
            { PathOnHost?: string; PathInContainer?: string }[] | null,
        },
        env: info.Config.Env ?? [],
      };
    } catch (error) {
      if (error instanceof DockerNotFoundError) return undefined;
      throw error;
    }
  }

  /**
   * Creates a container. Past its deadline the caller hears a deadline error at once, but the
   * request is not aborted: the engine may create the container all the same, and only its answer
   * names it. When that answer arrives, the container is removed (a confirmed removal), so a
   * start that gave up leaves no orphan behind (`late-create.ts`).
   */
  async createContainer(spec: ContainerSpec, signal?: AbortSignal): Promise<string> {
    // Only a spec with GPU requests needs to know the engine (detected now if it is not known yet).
    const engineSpec =
      spec.gpuRequests.length === 0
        ? spec
        : specForEngine(spec, this.engine ?? (await this.detectEngine(signal)).info);
    const body = engineCreateBody(engineSpec);
    const start = process.hrtime.bigint();
    const create = createUnderDeadline(
      (abortSignal) => this.docker.createContainer({ ...body, name: spec.name, abortSignal }),
      {
        timeoutMs: this.createTimeoutMs,
        lateBoundMs: Math.max(LATE_CREATE_BOUND_MS, this.createTimeoutMs),
        parent: signal,
        onLate: (container) => this.removeLateCreate(container.id),
      },
    );
    const settled = create.settled.finally(() => this.lateCreates.delete(settled));
    this.lateCreates.add(settled);
    try {
      const container = await create.answer;
      this.count("create", "ok", since(start));
      return container.id;
    } catch (error) {
      this.count("create", "error", since(start));
      throw mapDockerError(error, "create");
    }
  }

  /** Removes a container whose create answered after its deadline (nobody else knows its id). */
  private async removeLateCreate(id: string): Promise<void> {
    const start = process.hrtime.bigint();
    try {
      // Not under the shutdown's signal: the removal is bounded by its own 30 s.
      await this.removeContainer(id);
      this.count("late_create_remove", "ok", since(start));
    } catch {
      this.count("late_create_remove", "error", since(start));
    }
  }

  /**
   * Settles once every create that missed its deadline has ended and what it created was
   * removed (or its removal failed).
   */
  async lateCreatesSettled(): Promise<void> {
    while (this.lateCreates.size > 0) await Promise.all([...this.lateCreates]);
  }

  async startContainer(id: string, signal?: AbortSignal): Promise<void> {
    try {
      await this.call("start", DOCKER_DEADLINES.start, signal, (abortSignal) =>
        this.docker.getContainer(id).start({ abortSignal }),
      );
    } catch (error) {
      // 304: already started, which is what we asked for.
      if ((error as { statusCode?: number }).statusCode === 304) return;
      throw error;
    }
  }

  async stopContainer(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void> {
    const deadline = timeoutSeconds * 1000 + DOCKER_DEADLINES.stopExtra;
    try {
      await this.call("stop", deadline, signal, (abortSignal) =>
        this.docker.getContainer(id).stop({ t: timeoutSeconds, abortSignal }),
      );
    } catch (error) {
      const status = (error as { statusCode?: number }).statusCode;
      // 304: not running; 404: gone. Both mean "stopped".
      if (error instanceof DockerNotFoundError) return;
      if (status !== 304) throw error;
    }
    if (this.engine?.kind === "podman") await this.settlePodmanStop(id, signal);
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
      const info = await this.call("inspect", DOCKER_DEADLINES.inspect, signal, (abortSignal) =>
        this.docker.getContainer(id).inspect({ abortSignal }),
      ).catch(() => undefined);
      if (info?.State.Status !== "stopping") return;
      await sleep(STOP_SETTLE_POLL_MS, undefined, { signal }).catch(() => undefined);
    }
  }

  /** The seed's confirmed removal over the Engine API, within one 30 s deadline ({@link confirmRemoval}). */
  async removeContainer(id: string, signal?: AbortSignal): Promise<RemovalConfirmed> {
    return confirmRemoval(this.removalChannel(signal), id, OperationBound.within(this.removalTimeoutMs));
  }

  /** The Engine API as a removal channel; each call is capped by what is left of the bound. */
  private removalChannel(signal: AbortSignal | undefined): RemovalChannel {
    return {
      remove: async (id, bound): Promise<RemoveAnswer> => {
        const left = bound.remainingMs() ?? this.removalTimeoutMs;
        if (left === 0)
          return {
            kind: "failed",
            reason: { kind: "deadline", elapsedMs: bound.elapsedMs(), cleanup: null },
          };
        try {
          await this.call("remove", left, signal, (abortSignal) =>
            this.docker.getContainer(id).remove({ force: true, v: true, abortSignal }),
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
          await this.call("inspect", left, signal, (abortSignal) =>
            this.docker.getContainer(id).inspect({ abortSignal }),
          );
        } catch (error) {
          if (error instanceof DockerNotFoundError) return { kind: "absent" };
        }
        // Still there, or an answer that proves nothing: the deadline decides.
        return { kind: "unknown", cleanup: null };
      },
    };
  }

  /**
   * The last `lines` lines of a container's output, at most `LOG_TAIL_MAX_BYTES` of it. The
   * answer is read as a stream and only its end kept, and the engine is asked for few entries
   * first, then more (`nextLogTailEntries`) until the tail holds its bytes or every line wanted:
   * a workload that printed hundreds of MB without newlines costs one small read, not a buffer
   * of all its entries (`tail=3000` of such output was 49 MB in memory and on the wire).
   */
  async containerLogTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]> {
    return this.call("logs", DOCKER_DEADLINES.logs, signal, async (abortSignal) => {
      for (
        let entries = Math.min(lines, LOG_TAIL_FIRST_ENTRIES);
        ;
        entries = nextLogTailEntries(entries, lines)
      ) {
        const tail = await this.readLogTail(id, entries, abortSignal);
        if (tail.seen >= LOG_TAIL_MAX_BYTES || entries >= lines)
          return splitLogLines(tail.text()).slice(-lines);
      }
    });
  }

  /** One streamed read of the last `entries` log entries, its end kept (`LogTailCollector`). */
  private async readLogTail(
    id: string,
    entries: number,
    abortSignal: AbortSignal,
  ): Promise<LogTailCollector> {
    const stream = await new Promise<Readable>((resolve, reject) => {
      this.docker.modem.dial(
        {
          path: `/containers/${encodeURIComponent(id)}/logs?`,
          method: "GET",
          isStream: true,
          abortSignal,
          statusCodes: { 200: true, 404: "no such container", 500: "server error" },
          options: { stdout: true, stderr: true, tail: entries },
        },
        (error, result) => (error ? reject(error) : resolve(result as Readable)),
      );
    });
    const collector = new LogTailCollector();
    try {
      for await (const chunk of stream) collector.push(chunk as Buffer);
    } finally {
      stream.destroy();
    }
    return collector;
  }

  async imageExists(reference: string, signal?: AbortSignal): Promise<boolean> {
    try {
      await this.call("image-inspect", DOCKER_DEADLINES.image, signal, (abortSignal) =>
        this.docker.getImage(reference).inspect({ abortSignal } as object),
      );
      return true;
    } catch (error) {
      if (error instanceof DockerNotFoundError) return false;
      throw error;
    }
  }

  async pullImage(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable> {
    const engine = this.engine ?? (await this.detectEngine(signal)).info;
    const start = process.hrtime.bigint();
    try {
      // fromImage carries the tag or digest, so the engine never pulls "all tags".
      const stream = (await this.docker.createImage(auth ?? {}, {
        fromImage: reference,
        abortSignal: signal,
      })) as Readable;
      this.count("pull", "ok", since(start));
      if (engine.kind !== "podman") return stream;
      return completePodmanPull(stream, reference, () => this.imageExists(reference, signal));
    } catch (error) {
      this.count("pull", "error", since(start));
      throw mapDockerError(error, "pull");
    }
  }

  async *containerEvents(signal: AbortSignal): AsyncIterable<ContainerEvent> {
    let stream: Readable;
    const start = process.hrtime.bigint();
    try {
      stream = (await this.docker.getEvents({
        filters: { type: ["container"], ...TASK_FILTER },
        abortSignal: signal,
      })) as Readable;
      this.count("events", "ok", since(start));
    } catch (error) {
      this.count("events", "error", since(start));
      throw mapDockerError(error, "events");
    }
    const lines = createInterface({ input: stream, crlfDelay: Infinity });
    // readline ends its iteration when its input ends or it is closed, never when the input is
    // destroyed: without the close, a shutdown would wait on this loop forever.
    const onAbort = (): void => {
      lines.close();
      stream.destroy();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const line of lines) {
        const event = parseEvent(line);
        if (event) yield event;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      stream.destroy();
    }
  }
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

/**
 * An inspect's device requests; on Podman, which reports none, the CDI request the shim made,
 * read back from its label ({@link LABEL_CDI_DEVICES}).
 */
export function deviceRequestsOf(
  reported: readonly unknown[] | null | undefined,
  cdiLabel: string | undefined,
): { Driver?: string; DeviceIDs?: string[] }[] | null {
  const names = (cdiLabel ?? "").split(",").filter((name) => name !== "");
  if ((reported ?? []).length === 0 && names.length > 0) return [{ Driver: "cdi", DeviceIDs: names }];
  return (reported ?? null) as { Driver?: string; DeviceIDs?: string[] }[] | null;
}

/** One line of the engine's event stream → a task container's event; anything else → undefined. */
export function parseEvent(line: string): ContainerEvent | undefined {
  try {
    const raw = JSON.parse(line) as {
      Action?: string;
      Actor?: { ID?: string; Attributes?: Record<string, string> };
    };
    const taskId = raw.Actor?.Attributes?.[LABEL_TASK_ID];
    if (!raw.Action || !raw.Actor?.ID || !taskId) return undefined;
    // Events carry the container's labels as attributes, the owner label included.
    const owner = raw.Actor.Attributes?.[LABEL_OWNER] ?? "";
    const event = { action: raw.Action, containerId: raw.Actor.ID, taskId, owner };
    const exitCode = raw.Actor.Attributes?.exitCode;
    return exitCode !== undefined && /^\d{1,3}$/.test(exitCode)
      ? { ...event, exitCode: Number(exitCode) }
      : event;
  } catch {
    return undefined;
  }
}

/**
 * Splits Docker's multiplexed log buffer (8-byte frame headers) into plain text, stdout and
 * stderr interleaved as stored. A TTY container has no headers: the buffer is used as is.
 */
export function demuxLogBuffer(buffer: Buffer): string {
  const parts: Buffer[] = [];
  let offset = 0;
  while (offset + 8 <= buffer.length) {
    const stream = buffer[offset];
    const size = buffer.readUInt32BE(offset + 4);
    if ((stream !== 0 && stream !== 1 && stream !== 2) || buffer[offset + 1] !== 0) {
      return buffer.toString("utf8");
    }
    parts.push(buffer.subarray(offset + 8, offset + 8 + size));
    offset += 8 + size;
  }
  if (offset === 0 && buffer.length > 0) return buffer.toString("utf8");
  return Buffer.concat(parts).toString("utf8");
}

/** Splits log text into lines without the trailing empty line. */
export function splitLogLines(text: string): string[] {
  const lines = text.split(/\r?\n/);
  if (lines.at(-1) === "") lines.pop();
  return lines;
}

/**
 * Host port bindings (tcp, IPv4) from a list's `Ports`: the same bindings as an inspect's
 * NetworkSettings.Ports (one entry per binding, `PublicPort` absent when not published).
 */
export function listedPorts(
  ports:
    readonly { IP?: string; PrivatePort: number; PublicPort?: number; Type: string }[] | undefined | null,
): PortMapping[] {
  const mappings: PortMapping[] = [];
  for (const port of ports ?? []) {
    if (port.Type !== "tcp" || port.IP?.includes(":")) continue;
    const host = Number(port.PublicPort);
    if (Number.isInteger(host) && host > 0 && Number.isInteger(port.PrivatePort))
      mappings.push({ host, container: port.PrivatePort });
  }
  return mappings.sort((x, y) => x.container - y.container);
}

/** Host port bindings (tcp, IPv4) from an inspect's NetworkSettings.Ports. */
export function extractPorts(
  ports: Record<string, { HostIp?: string; HostPort?: string }[] | null> | undefined | null,
): PortMapping[] {
  const mappings: PortMapping[] = [];
  for (const [key, bindings] of Object.entries(ports ?? {})) {
    const [port, proto] = key.split("/");
    if (proto !== "tcp" || !bindings) continue;
    for (const binding of bindings) {
      if (binding.HostIp?.includes(":")) continue;
      const host = Number(binding.HostPort);
      const container = Number(port);
      if (Number.isInteger(host) && host > 0 && Number.isInteger(container))
        mappings.push({ host, container });
    }
  }
  return mappings.sort((a, b) => a.container - b.container);
}
