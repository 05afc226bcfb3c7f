/*
 * The one adapter from the `DockerClient` port to the Engine API (dockerode). It is put
 * together from the families of calls, each in its own file over one `EngineCalls` (a deadline
 * per short call, every call counted, typed errors): the engine's own (`engine-system.ts`),
 * containers (`engine-containers.ts`), images (`engine-images.ts`), and the streamed reads
 * (`engine-streams.ts`).
 */
import type { Readable } from "node:stream";
import Docker from "dockerode";
import type { EngineStorageRoot } from "../host/host-info.js";
import { REMOVAL_TIMEOUT_MS } from "./confirmed-removal.js";
import type {
  ContainerDetails,
  ContainerEvent,
  ContainerSpec,
  DockerClient,
  PullAuth,
  RemovalConfirmed,
  TaskContainerSummary,
} from "./docker-client.js";
import { DOCKER_DEADLINES, EngineCalls, type DockerCallCounter } from "./engine-calls.js";
import { EngineContainers } from "./engine-containers.js";
import type { EngineFingerprint, EngineFingerprintSource } from "./engine-fingerprint.js";
import { EngineImages } from "./engine-images.js";
import type { EngineDetection, EngineVersionSource } from "./engine-info.js";
import { EngineStreams } from "./engine-streams.js";
import { EngineSystem } from "./engine-system.js";

/** How to reach the engine: a unix socket, or a host and port. */
export interface EngineAddress {
  readonly socketPath?: string;
  readonly host?: string;
  readonly port?: number;
  readonly protocol?: "http" | "https";
}

/** The `DockerClient` port over dockerode, with the engine's identity and storage root. */
export class DockerodeClient
  implements DockerClient, EngineVersionSource, EngineStorageRoot, EngineFingerprintSource
{
  private readonly system: EngineSystem;
  private readonly containers: EngineContainers;
  private readonly images: EngineImages;
  private readonly streams: EngineStreams;

  constructor(
    options: EngineAddress = {},
    count: DockerCallCounter = () => undefined,
    /** The confirmed removal's deadline (the seed's 30 s; shorter only in tests). */
    removalTimeoutMs = REMOVAL_TIMEOUT_MS,
    /** The create's deadline ({@link DOCKER_DEADLINES}.create; shorter only in tests). */
    createTimeoutMs: number = DOCKER_DEADLINES.create,
  ) {
    const calls = new EngineCalls(new Docker(options), count);
    this.system = new EngineSystem(calls);
    this.containers = new EngineContainers(calls, this.system, {
      removalMs: removalTimeoutMs,
      createMs: createTimeoutMs,
    });
    this.images = new EngineImages(calls, this.system);
    this.streams = new EngineStreams(calls);
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

  ping(signal?: AbortSignal): Promise<void> {
    return this.system.ping(signal);
  }

  /** `GET /version`, read as which engine this is; the answer is kept for the creates that follow. */
  detectEngine(signal?: AbortSignal): Promise<EngineDetection> {
    return this.system.detectEngine(signal);
  }

  /**
   * Where the engine keeps images and containers (`DockerRootDir`; Podman's compatible answer
   * names its graph root there). Service mode's `disk_size` is measured on it.
   */
  async storageRoot(signal?: AbortSignal): Promise<string> {
    return (await this.system.fingerprint(signal)).rootDir;
  }

  /** Which engine instance answers here (engine-fingerprint.ts): `/version`'s kind, `/info`'s identity. */
  fingerprint(signal?: AbortSignal): Promise<EngineFingerprint> {
    return this.system.fingerprint(signal);
  }

  listTaskContainers(signal?: AbortSignal): Promise<TaskContainerSummary[]> {
    return this.containers.list(signal);
  }

  inspectContainer(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined> {
    return this.containers.inspect(idOrName, signal);
  }

  /**
   * Creates a container; one whose answer comes after its deadline is removed when it comes
   * (`EngineContainers.create`).
   */
  createContainer(spec: ContainerSpec, signal?: AbortSignal): Promise<string> {
    return this.containers.create(spec, signal);
  }

  /**
   * Settles once every create that missed its deadline has ended and what it created was
   * removed (or its removal failed).
   */
  lateCreatesSettled(): Promise<void> {
    return this.containers.lateCreatesSettled();
  }

  startContainer(id: string, signal?: AbortSignal): Promise<void> {
    return this.containers.start(id, signal);
  }

  stopContainer(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void> {
    return this.containers.stop(id, timeoutSeconds, signal);
  }

  /** The seed's confirmed removal over the Engine API, within one 30 s deadline. */
  removeContainer(id: string, signal?: AbortSignal): Promise<RemovalConfirmed> {
    return this.containers.remove(id, signal);
  }

  containerLogTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]> {
    return this.streams.logTail(id, lines, signal);
  }

  imageExists(reference: string, signal?: AbortSignal): Promise<boolean> {
    return this.images.exists(reference, signal);
  }

  pullImage(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable> {
    return this.images.pull(reference, auth, signal);
  }

  containerEvents(signal: AbortSignal): AsyncIterable<ContainerEvent> {
    return this.streams.events(signal);
  }
}
