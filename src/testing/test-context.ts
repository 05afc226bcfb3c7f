/*
 * A full `RunnerContext` over a temp home for the lifecycle engine's and the HTTP edge's unit
 * tests: a fake engine, real stores and host collaborators over a scripted command runner.
 */
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import type { ContainerParams } from "../docker/container-spec.js";
import type { ContainerState } from "../docker/docker-client.js";
import { AuthorizedKeys, HostKeysReconciler, type UserLookup } from "../host/authorized-keys.js";
import { GpuLock } from "../host/gpu-lock.js";
import { HostVolumes } from "../host/volumes.js";
import { ContainerOwnership } from "../runner/ownership.js";
import { Reconciler } from "../runner/reconciler.js";
import type { RunnerContext } from "../runner/runner-context.js";
import { TaskRunner } from "../runner/task-runner.js";
import { StorageHealth } from "../state/storage-health.js";
import { TaskDirs } from "../state/task-dirs.js";
import { containerNameFor } from "../tasks/container-name.js";
import type { Task } from "../tasks/task.js";
import type { TaskStatus } from "../tasks/task-status.js";
import { TaskStore } from "../tasks/task-store.js";
import type { TerminationReason } from "../tasks/termination-reason.js";
import { FakeCommandRunner } from "./fake-command-runner.js";
import { FakeDockerClient, type FakeContainer } from "./fake-docker-client.js";
import { hostConfigFor, taskConfig, TWO_AMD_GPUS } from "./fixtures.js";

/** The home identity of every test context (unless `ownership` is overridden). */
export const TEST_HOME_ID = "test-home";

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
    ...(overrides.observer ? { observer: overrides.observer } : {}),
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
      ...(container && options.withContainerId !== false ? { containerId: container.id } : {}),
      ...(container && containerState !== "created" ? { ports: [] } : {}),
      gpuIds,
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
      // A kicked finalize may still be committing task.json when a test's last assertion passes.
      await reconciler.settled();
      if (ownsHome) await rm(home, { recursive: true, force: true });
    },
  };
}
