/*
 * Test support for the lifecycle engine and the HTTP edge: an in-memory Docker engine behind the
 * `DockerClient` port, a scripted `CommandRunner`, and a full `RunnerContext` over a temp home.
 * Not a test itself; imported by the unit tests beside it and by any other suite that wants it.
 */
import { generateKeyPairSync } from "node:crypto";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { pino, type Logger } from "pino";
import type { ContainerParams } from "../docker/container-spec.js";
import {
  LABEL_IS_TASK,
  LABEL_OWNER,
  LABEL_TASK_ID,
  type ContainerCreateSpec,
  type ContainerMount,
  type ContainerDetails,
  type ContainerEvent,
  type ContainerState,
  type DockerClient,
  type PullAuth,
  type RemovalConfirmed,
  type TaskContainerSummary,
} from "../docker/docker-client.js";
import { DockerConflictError, DockerNotFoundError } from "../docker/docker-errors.js";
import type { BoundedOutcome, CommandRequest, CommandRunner } from "../exec/run-bounded.js";
import { AuthorizedKeys, HostKeysReconciler, type UserLookup } from "../host/authorized-keys.js";
import { gpuContainerConfig, type GpuInventory } from "../host/gpu-inventory.js";
import { GpuLock } from "../host/gpu-lock.js";
import { HostVolumes } from "../host/volumes.js";
import { StorageHealth } from "../state/storage-health.js";
import { TaskDirs } from "../state/task-dirs.js";
import { containerNameFor } from "../tasks/container-name.js";
import type { PortMapping, Task } from "../tasks/task.js";
import { parseTaskConfig, type RegistryAuth, type TaskConfig } from "../tasks/task-config.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { TaskStore } from "../tasks/task-store.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { ContainerOwnership } from "./ownership.js";
import { Reconciler } from "./reconciler.js";
import type { RunnerContext } from "./runner-context.js";
import { TaskRunner } from "./task-runner.js";

/** The home identity of every test context (unless `ownership` is overridden). */
export const TEST_HOME_ID = "test-home";

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
  mounts: ContainerMount[];
  image: string;
  startedAt: string;
  finishedAt: string;
}

type Behaviour =
  | { readonly kind: "throw"; readonly error: Error; readonly afterEffect: boolean }
  | { readonly kind: "hang" }
  | { readonly kind: "hook"; readonly fn: () => void | Promise<void> };

/** Produces the NDJSON stream of one pull. */
export type PullScript = (reference: string, auth: PullAuth | undefined, signal: AbortSignal) => Readable;

/** A pull that succeeds: one layer downloaded and extracted, then the final status line. */
export const SUCCESSFUL_PULL_LINES: readonly string[] = [
  '{"status":"Pulling from library/busybox","id":"1.36"}',
  '{"status":"Pulling fs layer","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Downloading","progressDetail":{"current":512,"total":1024},"id":"a1b2c3d4e5f6"}',
  '{"status":"Download complete","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Extracting","progressDetail":{"current":1024,"total":1024},"id":"a1b2c3d4e5f6"}',
  '{"status":"Pull complete","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Digest: sha256:0000000000000000000000000000000000000000000000000000000000000000"}',
  '{"status":"Status: Downloaded newer image for busybox:1.36"}',
];

/** A pull stream of the given NDJSON lines (each is sent as its own chunk). */
export function pullStream(lines: readonly string[]): Readable {
  return Readable.from(lines.map((line) => Buffer.from(`${line}\n`)));
}

/**
 * A pull stream that sends `lines` and then stays open (like a slow registry) until `signal`
 * aborts; it never sends the final status line.
 */
export function stalledPullStream(lines: readonly string[], signal: AbortSignal): Readable {
  async function* generate(): AsyncGenerator<Buffer> {
    for (const line of lines) yield Buffer.from(`${line}\n`);
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", () => resolve(), { once: true });
    });
  }
  return Readable.from(generate());
}

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
      };
    });
  }

  createContainer(spec: ContainerCreateSpec, signal?: AbortSignal): Promise<string> {
    return this.invoke("createContainer", [spec], signal, () => {
      if (this.find(spec.name)) {
        throw new DockerConflictError(
          `create: Conflict. The container name "/${spec.name}" is already in use by container`,
          409,
        );
      }
      const body = spec.body;
      const hostConfig = (body.HostConfig ?? {}) as ContainerDetails["hostConfig"];
      const container = this.addContainer({
        name: spec.name,
        state: "created",
        labels: { ...((body.Labels ?? {}) as Record<string, string>) },
        hostConfig,
      });
      container.image = typeof body.Image === "string" ? body.Image : "";
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
    return {
      async *[Symbol.asyncIterator]() {
        const queue: ContainerEvent[] = [];
        let wake: (() => void) | undefined;
        const listener = (event: ContainerEvent): void => {
          queue.push(event);
          wake?.();
        };
        const onAbort = (): void => wake?.();
        listeners.add(listener);
        signal.addEventListener("abort", onAbort, { once: true });
        try {
          while (!signal.aborted) {
            const next = queue.shift();
            if (next) {
              yield next;
              continue;
            }
            await new Promise<void>((resolve) => (wake = resolve));
            wake = undefined;
          }
        } finally {
          listeners.delete(listener);
          signal.removeEventListener("abort", onAbort);
        }
      },
    };
  }
}

/** Answers external commands from a script; by default it is a host where nothing is mounted. */
export class FakeCommandRunner implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  /** Mount points `mountpoint -q` reports as mounted; `umount` removes them. */
  readonly mounted = new Set<string>();
  /** Overrides the default answers when it returns an outcome. */
  script: ((argv: readonly string[]) => BoundedOutcome | Promise<BoundedOutcome> | undefined) | undefined;

  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const scripted = this.script?.(request.argv);
    if (scripted) return Promise.resolve(scripted);
    const [program, ...args] = request.argv;
    const target = args.at(-1) ?? "";
    if (program === "mountpoint") return Promise.resolve(exited(this.mounted.has(target) ? 0 : 1));
    if (program === "umount") this.mounted.delete(target);
    return Promise.resolve(exited(0));
  }

  /** The argv of every call whose program is `program`. */
  argvsOf(program: string): string[][] {
    return this.calls.map((call) => [...call.argv]).filter((argv) => argv[0] === program);
  }
}

/** An `exited` outcome of a command. */
export function exited(code: number, stdout = "", stderr = ""): BoundedOutcome {
  return { kind: "exited", code, signal: null, stdout: Buffer.from(stdout), stderr: Buffer.from(stderr) };
}

/** Two AMD-style GPUs (render nodes as resource ids), as a fixture would give. */
export const TWO_AMD_GPUS: GpuInventory = {
  vendor: "amd",
  gpus: [
    {
      vendor: "amd",
      name: "MI300X",
      vramMiB: 196_608,
      id: "/dev/dri/renderD128",
      index: 0,
      driverVersion: "6.8.5",
    },
    {
      vendor: "amd",
      name: "MI300X",
      vramMiB: 196_608,
      id: "/dev/dri/renderD129",
      index: 1,
      driverVersion: "6.8.5",
    },
  ],
};

/** A valid OpenSSH ed25519 public key line (fresh for every call). */
export function sshEd25519PublicKey(comment = "test@host"): string {
  const { publicKey } = generateKeyPairSync("ed25519");
  const x = publicKey.export({ format: "jwk" }).x ?? "";
  const raw = Buffer.from(x, "base64url");
  const string = (b: Buffer): Buffer => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(b.length);
    return Buffer.concat([length, b]);
  };
  const blob = Buffer.concat([string(Buffer.from("ssh-ed25519")), string(raw)]);
  return `ssh-ed25519 ${blob.toString("base64")} ${comment}`;
}

let taskCounter = 0;

/** A valid submit body (`parseTaskConfig` input) with a unique id and name, plus overrides. */
export function taskBody(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const n = ++taskCounter;
  return { id: `task-${n}`, name: `job${n}`, image_name: "busybox:1.36", ...overrides };
}

/** A parsed config and credentials, as the API would hand them to `TaskRunner.submit`. */
export function taskConfig(overrides: Record<string, unknown> = {}): {
  config: TaskConfig;
  auth: RegistryAuth;
} {
  return parseTaskConfig(taskBody(overrides));
}

/** Polls `condition` until it holds; throws after `timeoutMs`. */
export async function waitFor(
  condition: () => boolean,
  options: { readonly timeoutMs?: number; readonly intervalMs?: number; readonly what?: string } = {},
): Promise<void> {
  const deadline = Date.now() + (options.timeoutMs ?? 2_000);
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${options.what ?? "condition"}`);
    await new Promise((resolve) => setTimeout(resolve, options.intervalMs ?? 2));
  }
}

/** A logger that keeps every line it writes, to check what reached the logs. */
export function capturingLogger(): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      lines.push(chunk.toString("utf8"));
      callback();
    },
  });
  return { log: pino({ level: "trace" }, sink), lines };
}

/** What `makeContext` may replace. */
export type ContextOverrides = Partial<Omit<RunnerContext, "docker" | "shutdown">> & {
  /** Reuse a home (a "restarted" shim); it is then not deleted by `dispose`. */
  readonly home?: string;
  readonly docker?: FakeDockerClient;
  readonly commands?: FakeCommandRunner;
};

/** A runner context over a temp home, with the engine and collaborators it was built from. */
export interface TestEnv {
  readonly ctx: RunnerContext;
  readonly home: string;
  readonly docker: FakeDockerClient;
  readonly commands: FakeCommandRunner;
  readonly runner: TaskRunner;
  readonly reconciler: Reconciler;
  /** Aborting it is the shim's shutdown. */
  readonly shutdownController: AbortController;
  /** The home directory the fake user lookup gives `user`. */
  userHome(user: string): string;
  /** Submits a task (the start runs in the background). */
  submit(overrides?: Record<string, unknown>): Promise<Task>;
  /** Submits a task and waits until its start has returned. */
  submitAndStart(overrides?: Record<string, unknown>): Promise<Task>;
  /** Adds a task straight to the store (and task.json), with its container and GPUs. */
  seedTask(options?: SeedTaskOptions): Promise<{ task: Task; container: FakeContainer | undefined }>;
  /** Stops background work and deletes the temp home (if this env created it). */
  dispose(): Promise<void>;
}

/** The shape of a seeded task. */
export interface SeedTaskOptions {
  readonly config?: Record<string, unknown>;
  readonly status?: TaskStatus;
  /** The container to create; `"none"` for no container. Defaults to `running`. */
  readonly containerState?: ContainerState | "none";
  readonly exitCode?: number;
  readonly oomKilled?: boolean;
  readonly logs?: readonly string[];
  /** How many GPUs the task holds (locked in the context's GpuLock). */
  readonly gpus?: number;
  readonly terminationReason?: TerminationReason | "";
  readonly terminationMessage?: string;
  readonly cleanedUp?: boolean;
  readonly startInFlight?: boolean;
  /** Record the container id on the task (default true when there is a container). */
  readonly withContainerId?: boolean;
}

/**
 * Builds a full `RunnerContext` over a temp home: a {@link FakeDockerClient}, a real `TaskStore`,
 * `TaskDirs`, `GpuLock` over {@link TWO_AMD_GPUS}, real `HostVolumes` and `HostKeysReconciler`
 * over a {@link FakeCommandRunner} and a fake user lookup (homes under the temp dir), and a
 * silent pino logger. Pass `home` and `docker` of an earlier env to "restart" the shim.
 */
export async function makeContext(overrides: ContextOverrides = {}): Promise<TestEnv> {
  const ownsHome = overrides.home === undefined;
  const home = overrides.home ?? (await mkdtemp(join(tmpdir(), "taskshim-test-")));
  const docker = overrides.docker ?? new FakeDockerClient();
  const commands = overrides.commands ?? new FakeCommandRunner();
  const shutdownController = new AbortController();
  const inventory = overrides.inventory ?? TWO_AMD_GPUS;
  const userHome = (user: string): string => join(home, "users", user);
  // Every user exists and has a home, owned by whoever runs the tests.
  const lookup: UserLookup = async (name) => {
    await mkdir(userHome(name), { recursive: true });
    return { name, home: userHome(name), uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 };
  };
  const params: ContainerParams = {
    runnerBinaryPath: join(home, "bin", "dstack-runner"),
    runnerHttpPort: 10999,
    runnerSshPort: 10022,
    runnerLogLevel: "4",
    runnerSshLogLevel: "",
    baseEnv: [],
    privileged: false,
    pjrtDevice: "",
    volumeMountRoot: join(home, "volumes"),
    infiniband: false,
  };
  const ctx: RunnerContext = {
    docker,
    store: overrides.store ?? new TaskStore(),
    dirs: overrides.dirs ?? new TaskDirs(home),
    inventory,
    gpuLock: overrides.gpuLock ?? new GpuLock(inventory),
    hostKeys: overrides.hostKeys ?? new HostKeysReconciler(new AuthorizedKeys(lookup)),
    volumes: overrides.volumes ?? new HostVolumes(commands, { mountRoot: params.volumeMountRoot }),
    params: overrides.params ?? params,
    ownership: overrides.ownership ?? new ContainerOwnership(TEST_HOME_ID, false),
    bootId: overrides.bootId ?? "00000000-test-boot-id",
    log: overrides.log ?? pino({ level: "silent" }),
    shutdown: shutdownController.signal,
    storage: overrides.storage ?? new StorageHealth(join(home, "runners")),
  };
  const runner = new TaskRunner(ctx);
  const reconciler = new Reconciler(ctx, runner);

  const submit = (body: Record<string, unknown> = {}): Promise<Task> => {
    const { config, auth } = taskConfig(body);
    return runner.submit(config, auth);
  };

  const seedTask = async (options: SeedTaskOptions = {}) => {
    const { config } = taskConfig(options.config ?? {});
    const containerName = containerNameFor(config.name, config.id);
    const taskDir = await ctx.dirs.make(containerName);
    const gpuIds = options.gpus ? ctx.gpuLock.acquire(options.gpus) : [];
    const containerState = options.containerState ?? "running";
    const container =
      containerState === "none"
        ? undefined
        : docker.addContainer({
            taskId: config.id,
            name: containerName,
            state: containerState,
            ...(options.exitCode !== undefined ? { exitCode: options.exitCode } : {}),
            ...(options.oomKilled !== undefined ? { oomKilled: options.oomKilled } : {}),
            ...(options.logs ? { logs: options.logs } : {}),
            hostConfig: gpuIds.length > 0 ? hostConfigFor(inventory, gpuIds) : {},
          });
    const status = options.status ?? "running";
    const task = ctx.store.add({
      id: config.id,
      status,
      terminationReason: options.terminationReason ?? (status === "terminated" ? "terminated_by_user" : ""),
      terminationMessage: options.terminationMessage ?? "",
      config,
      containerName,
      containerId: container && options.withContainerId !== false ? container.id : "",
      ports: container && containerState !== "created" ? [] : null,
      gpuIds,
      pullProgress: null,
      taskDir,
      cleanedUp: options.cleanedUp ?? false,
      startInFlight: options.startInFlight ?? false,
    });
    await runner.persister.persist(task.id);
    return { task, container };
  };

  return {
    ctx,
    home,
    docker,
    commands,
    runner,
    reconciler,
    shutdownController,
    userHome,
    submit,
    async submitAndStart(body = {}) {
      const task = await submit(body);
      await runner.awaitStarts();
      return ctx.store.mustGet(task.id);
    },
    seedTask,
    async dispose() {
      shutdownController.abort(new Error("test finished"));
      runner.cancelPulls();
      await runner.awaitStarts();
      if (ownsHome) await rm(home, { recursive: true, force: true });
    },
  };
}

/** The inspected `HostConfig` of a container that holds `ids` (as the create spec sets it). */
export function hostConfigFor(
  inventory: GpuInventory,
  ids: readonly string[],
): ContainerDetails["hostConfig"] {
  const gpu = gpuContainerConfig(inventory, ids);
  return {
    Devices: gpu.devices.map((d) => ({ PathOnHost: d.PathOnHost, PathInContainer: d.PathInContainer })),
    DeviceRequests: gpu.deviceRequests.map((r) => ({ DeviceIDs: [...r.DeviceIDs] })),
  };
}
