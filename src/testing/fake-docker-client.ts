/*
 * An in-memory Docker engine behind the `DockerClient` port, for unit tests (the lifecycle engine,
 * the HTTP edge) and for engine faults a real engine cannot produce on demand.
 */
import { Readable } from "node:stream";
import {
  LABEL_IS_TASK,
  LABEL_OWNER,
  LABEL_TASK_ID,
  type ContainerMount,
  type ContainerSpec,
  type ContainerDetails,
  type ContainerEvent,
  type ContainerState,
  type DockerClient,
  type PullAuth,
  type RemovalConfirmed,
  type TaskContainerSummary,
} from "../docker/docker-client.js";
import type { PortMapping } from "../tasks/task-parts.js";
import { DockerConflictError, DockerNotFoundError } from "../docker/docker-errors.js";
import { inspectedHostConfig } from "./container-specs.js";
import { pullStream, SUCCESSFUL_PULL_LINES } from "./pull-streams.js";

/** The methods of the Docker port, as recorded by {@link FakeDockerClient}. */
export type DockerMethod = keyof DockerClient;

/** One recorded call of the fake engine. */
export interface DockerCall {
  readonly method: DockerMethod;
  readonly args: readonly unknown[];
  readonly signal: AbortSignal | undefined;
}

/** A container of the fake engine; tests may change its fields directly. */
export interface FakeContainer {
  readonly id: string;
  name: string;
  labels: Record<string, string>;
  state: ContainerState;
  exitCode: number;
  oomKilled: boolean;
  /** Log lines as Docker stored them (stdout and stderr interleaved). */
  logs: string[];
  ports: PortMapping[];
  hostConfig: ContainerDetails["hostConfig"];
  /** Its environment as created (`NAME=value`). */
  env: string[];
  mounts: ContainerMount[];
  image: string;
  startedAt: string;
  finishedAt: string;
}

type Behaviour =
  | { readonly kind: "throw"; readonly error: Error; readonly afterEffect: boolean }
  | { readonly kind: "hang" }
  | { readonly kind: "hook"; readonly fn: () => void | Promise<void> }
  | { readonly kind: "after"; readonly fn: () => void | Promise<void> };

/** Produces the NDJSON stream of one pull. */
export type PullScript = (reference: string, auth: PullAuth | undefined, signal: AbortSignal) => Readable;

function abortError(signal: AbortSignal | undefined): Error {
  const reason: unknown = signal?.reason;
  return reason instanceof Error ? reason : new Error("operation aborted");
}

/**
 * An in-memory Docker engine. Every call is recorded (method, arguments, signal); the next call
 * of a method can be made to throw (before or after its effect), to hang until its signal
 * aborts, or to run a hook first. `exit`, `remove` and `setState` change containers behind the
 * shim's back, as a workload or an operator would.
 */
export class FakeDockerClient implements DockerClient {
  readonly containers = new Map<string, FakeContainer>();
  readonly images = new Set<string>();
  readonly calls: DockerCall[] = [];
  /** Container ids left out of list answers (a list glitch), though they still exist. */
  readonly hiddenFromList = new Set<string>();
  /** How each pull streams; defaults to {@link SUCCESSFUL_PULL_LINES}. */
  pullScript: PullScript = () => pullStream(SUCCESSFUL_PULL_LINES);
  /** When set, every call fails with it (an unreachable engine). */
  down: Error | undefined;
  private readonly scripted = new Map<DockerMethod, Behaviour[]>();
  private readonly eventListeners = new Set<(event: ContainerEvent) => void>();
  /** Ends each open event stream: quietly (the engine closed it) or with an error (it broke). */
  private readonly eventStreams = new Set<(error: Error | undefined) => void>();
  private seq = 0;

  // --- programming the fake -------------------------------------------------------------

  /** The next call of `method` throws `error`; with `afterEffect`, only after doing its work. */
  failNext(method: DockerMethod, error: Error, options: { afterEffect?: boolean } = {}): this {
    return this.script(method, { kind: "throw", error, afterEffect: options.afterEffect ?? false });
  }

  /** The next call of `method` hangs until its signal aborts (forever without a signal). */
  hangNext(method: DockerMethod): this {
    return this.script(method, { kind: "hang" });
  }

  /** Runs `fn` at the start of the next call of `method`, then performs the call. */
  onNext(method: DockerMethod, fn: () => void | Promise<void>): this {
    return this.script(method, { kind: "hook", fn });
  }

  /**
   * Runs `fn` right after the next call of `method` has done its work, before it answers (a
   * workload that exits the moment its start returns: `afterNext("startContainer", …)`).
   */
  afterNext(method: DockerMethod, fn: () => void | Promise<void>): this {
    return this.script(method, { kind: "after", fn });
  }

  private script(method: DockerMethod, behaviour: Behaviour): this {
    const queue = this.scripted.get(method) ?? [];
    queue.push(behaviour);
    this.scripted.set(method, queue);
    return this;
  }

  // --- inspecting what happened ---------------------------------------------------------

  /** The recorded calls of one method. */
  callsOf(method: DockerMethod): DockerCall[] {
    return this.calls.filter((call) => call.method === method);
  }

  /** How many times `method` was called. */
  count(method: DockerMethod): number {
    return this.callsOf(method).length;
  }

  /** Forgets the recorded calls. */
  resetCalls(): void {
    this.calls.length = 0;
  }

  // --- changing containers behind the shim's back ---------------------------------------

  /** Adds a container as if a shim (or anyone) had created it. */
  addContainer(options: {
    readonly taskId?: string;
    readonly name?: string;
    readonly state?: ContainerState;
    readonly exitCode?: number;
    readonly oomKilled?: boolean;
    readonly logs?: readonly string[];
    readonly hostConfig?: ContainerDetails["hostConfig"];
    readonly env?: readonly string[];
    readonly labels?: Record<string, string>;
    readonly ports?: PortMapping[];
    readonly mounts?: ContainerMount[];
  }): FakeContainer {
    const id = this.nextId();
    const labels =
      options.labels ??
      (options.taskId === undefined ? {} : { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: options.taskId });
    const container: FakeContainer = {
      id,
      name: options.name ?? `container-${id.slice(-8)}`,
      labels,
      state: options.state ?? "running",
      exitCode: options.exitCode ?? 0,
      oomKilled: options.oomKilled ?? false,
      logs: [...(options.logs ?? [])],
      ports: options.ports ?? [],
      hostConfig: options.hostConfig ?? {},
      env: [...(options.env ?? [])],
      mounts: options.mounts ?? [],
      image: "busybox:1.36",
      startedAt: new Date().toISOString(),
      finishedAt: "0001-01-01T00:00:00Z",
    };
    this.containers.set(id, container);
    return container;
  }

  /** The container whose id or name is `idOrName`. */
  find(idOrName: string): FakeContainer | undefined {
    return this.containers.get(idOrName) ?? [...this.containers.values()].find((c) => c.name === idOrName);
  }

  /** The container, or a thrown error naming it. */
  mustFind(idOrName: string): FakeContainer {
    const container = this.find(idOrName);
    if (!container) throw new Error(`fake docker: no container ${idOrName}`);
    return container;
  }

  /** The workload exits with `code` (and may leave log lines or be OOM-killed). */
  exit(
    id: string,
    code: number,
    options: { readonly logs?: readonly string[]; readonly oomKilled?: boolean } = {},
  ): void {
    const container = this.mustFind(id);
    container.state = "exited";
    container.exitCode = code;
    container.oomKilled = options.oomKilled ?? false;
    container.finishedAt = new Date().toISOString();
    container.logs.push(...(options.logs ?? []));
    this.emit({
      action: "die",
      containerId: container.id,
      taskId: this.taskIdOf(container),
      owner: this.ownerOf(container),
      exitCode: code,
    });
  }

  /** The container vanishes (an operator's `docker rm -f`), without a recorded call. */
  remove(id: string): void {
    const container = this.mustFind(id);
    this.containers.delete(container.id);
    this.emit({
      action: "destroy",
      containerId: container.id,
      taskId: this.taskIdOf(container),
      owner: this.ownerOf(container),
    });
  }

  /** Sets a container's state directly. */
  setState(id: string, state: ContainerState): void {
    this.mustFind(id).state = state;
  }

  /** Sends an event to every follower of the event stream. */
  emit(event: ContainerEvent): void {
    for (const listener of this.eventListeners) listener(event);
  }

  /** How many event streams are open (followed and not ended). */
  openEventStreams(): number {
    return this.eventStreams.size;
  }

  /**
   * Ends every open event stream after the events already sent: quietly (the engine closed the
   * connection) or, with `error`, as a broken connection does. A real engine cannot be made to
   * do either on demand without disturbing every other test on it.
   */
  dropEvents(error?: Error): void {
    for (const end of this.eventStreams) end(error);
  }

  private nextId(): string {
    return (++this.seq).toString(16).padStart(64, "c");
  }

  private taskIdOf(container: FakeContainer): string {
    return container.labels[LABEL_TASK_ID] ?? "";
  }

  private ownerOf(container: FakeContainer): string {
    return container.labels[LABEL_OWNER] ?? "";
  }

  private async invoke<T>(
    method: DockerMethod,
    args: readonly unknown[],
    signal: AbortSignal | undefined,
    op: () => T | Promise<T>,
  ): Promise<T> {
    this.calls.push({ method, args, signal });
    const behaviour = this.scripted.get(method)?.shift();
    if (behaviour?.kind === "throw" && !behaviour.afterEffect) throw behaviour.error;
    if (behaviour?.kind === "hang") {
      await new Promise<never>((_resolve, reject) => {
        if (signal?.aborted) reject(abortError(signal));
        signal?.addEventListener("abort", () => reject(abortError(signal)), { once: true });
      });
    }
    if (behaviour?.kind === "hook") await behaviour.fn();
    if (signal?.aborted) throw abortError(signal);
    if (this.down) throw this.down;
    const result = await op();
    if (behaviour?.kind === "after") await behaviour.fn();
    if (behaviour?.kind === "throw" && behaviour.afterEffect) throw behaviour.error;
    return result;
  }

  // --- the DockerClient port ------------------------------------------------------------

  ping(signal?: AbortSignal): Promise<void> {
    return this.invoke("ping", [], signal, () => undefined);
  }

  listTaskContainers(signal?: AbortSignal): Promise<TaskContainerSummary[]> {
    return this.invoke("listTaskContainers", [], signal, () =>
      [...this.containers.values()]
        .filter((c) => c.labels[LABEL_IS_TASK] === "true" && !this.hiddenFromList.has(c.id))
        .map((c) => ({
          id: c.id,
          name: c.name,
          taskId: this.taskIdOf(c),
          owner: this.ownerOf(c),
          state: c.state,
          // As the engine's list: the same port bindings as its inspect.
          ports: [...c.ports],
        })),
    );
  }

  inspectContainer(idOrName: string, signal?: AbortSignal): Promise<ContainerDetails | undefined> {
    return this.invoke("inspectContainer", [idOrName], signal, () => {
      const c = this.find(idOrName);
      if (!c) return undefined;
      return {
        id: c.id,
        name: c.name,
        taskId: this.taskIdOf(c),
        owner: this.ownerOf(c),
        state: c.state,
        exitCode: c.exitCode,
        oomKilled: c.oomKilled,
        error: "",
        startedAt: c.startedAt,
        finishedAt: c.finishedAt,
        restartCount: 0,
        ports: [...c.ports],
        mounts: [...c.mounts],
        hostConfig: c.hostConfig,
        env: [...c.env],
      };
    });
  }

  createContainer(spec: ContainerSpec, signal?: AbortSignal): Promise<string> {
    return this.invoke("createContainer", [spec], signal, () => {
      if (this.find(spec.name)) {
        throw new DockerConflictError(
          `create: Conflict. The container name "/${spec.name}" is already in use by container`,
          409,
        );
      }
      const container = this.addContainer({
        name: spec.name,
        state: "created",
        labels: { ...spec.labels },
        hostConfig: inspectedHostConfig(spec),
        env: spec.env,
      });
      container.image = spec.image;
      return container.id;
    });
  }

  startContainer(id: string, signal?: AbortSignal): Promise<void> {
    return this.invoke("startContainer", [id], signal, () => {
      const c = this.find(id);
      if (!c) throw new DockerNotFoundError(`start: No such container: ${id}`, 404);
      c.state = "running";
      c.startedAt = new Date().toISOString();
    });
  }

  stopContainer(id: string, timeoutSeconds: number, signal?: AbortSignal): Promise<void> {
    return this.invoke("stopContainer", [id, timeoutSeconds], signal, () => {
      const c = this.find(id);
      if (!c || (c.state !== "running" && c.state !== "paused" && c.state !== "restarting")) return;
      c.state = "exited";
      c.exitCode = timeoutSeconds === 0 ? 137 : 143;
      c.finishedAt = new Date().toISOString();
      this.emit({
        action: "die",
        containerId: c.id,
        taskId: this.taskIdOf(c),
        owner: this.ownerOf(c),
        exitCode: c.exitCode,
      });
    });
  }

  removeContainer(id: string, signal?: AbortSignal): Promise<RemovalConfirmed> {
    return this.invoke("removeContainer", [id], signal, (): RemovalConfirmed => {
      const c = this.find(id);
      if (!c) return "already-absent";
      this.containers.delete(c.id);
      this.emit({ action: "destroy", containerId: c.id, taskId: this.taskIdOf(c), owner: this.ownerOf(c) });
      return "removed";
    });
  }

  containerLogTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]> {
    return this.invoke("containerLogTail", [id, lines], signal, () => {
      const c = this.find(id);
      if (!c) throw new DockerNotFoundError(`logs: No such container: ${id}`, 404);
      return c.logs.slice(-lines);
    });
  }

  imageExists(reference: string, signal?: AbortSignal): Promise<boolean> {
    return this.invoke("imageExists", [reference], signal, () => this.images.has(reference));
  }

  pullImage(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable> {
    return this.invoke("pullImage", [reference, auth], signal, () =>
      this.pullScript(reference, auth, signal),
    );
  }

  containerEvents(signal: AbortSignal): AsyncIterable<ContainerEvent> {
    this.calls.push({ method: "containerEvents", args: [], signal });
    const listeners = this.eventListeners;
    const streams = this.eventStreams;
    // A scripted failure is thrown when the stream is first read (as a refused connection is).
    const behaviour = this.scripted.get("containerEvents")?.shift();
    return {
      async *[Symbol.asyncIterator]() {
        if (behaviour?.kind === "throw") throw behaviour.error;
        const queue: ContainerEvent[] = [];
        let wake: (() => void) | undefined;
        let ended: { readonly error: Error | undefined } | undefined;
        const listener = (event: ContainerEvent): void => {
          queue.push(event);
          wake?.();
        };
        const end = (error: Error | undefined): void => {
          ended = { error };
          wake?.();
        };
        const onAbort = (): void => wake?.();
        listeners.add(listener);
        streams.add(end);
        signal.addEventListener("abort", onAbort, { once: true });
        try {
          while (!signal.aborted) {
            const next = queue.shift();
            if (next) {
              yield next;
              continue;
            }
            if (ended) {
              if (ended.error) throw ended.error;
              return;
            }
            await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
          }
        } finally {
          listeners.delete(listener);
          streams.delete(end);
          signal.removeEventListener("abort", onAbort);
        }
      },
    };
  }
}
