import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type Docker from "dockerode";
import pLimit from "p-limit";
import { containerParamsOf, resolveShimConfig } from "../../src/config/shim-config.js";
import { buildContainerSpec } from "../../src/docker/container-spec.js";
import { engineCreateBody } from "../../src/docker/engine-create-body.js";
import { formatPullReference, parseImageReference } from "../../src/tasks/image-ref.js";
import { parseTaskConfig } from "../../src/tasks/task-config.js";
import { hasStatusCode } from "../../test/support/docker.js";
import { ensureTestImages, type TestImages } from "../../test/support/images.js";
import { ShimProcess, tempHome } from "../../test/support/shim-process.js";
import { engineTarget, type EngineTarget } from "./engines.js";

/** Label on every container the benchmarks create directly (the baselines). */
export const BENCH_LABEL = "taskshim.bench";
/** Every task and container name of a run starts with `bn-<nonce>-`. */
export const NAME_PREFIX = "bn-";

/** Wall-clock milliseconds with sub-millisecond resolution (comparable to Docker's timestamps). */
export function wallMs(): number {
  return performance.timeOrigin + performance.now();
}

/** Docker's RFC 3339 timestamp with nanoseconds, as wall-clock milliseconds (sub-ms kept). */
export function dockerTimeMs(value: string): number {
  const match = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(value);
  if (!match) throw new Error(`unexpected docker timestamp ${value}`);
  const seconds = Date.parse(`${match[1]}${match[3]}`);
  const fraction = Number(`0.${match[2] ?? "0"}`);
  return seconds + fraction * 1000;
}

/** `GET /api/tasks` as a map id → status; throws on a non-200 answer or a refused connection. */
export async function taskStatuses(shim: { readonly url: string }): Promise<Map<string, string>> {
  const response = await fetch(`${shim.url}/api/tasks`, { signal: AbortSignal.timeout(10_000) });
  if (response.status !== 200) throw new Error(`GET /api/tasks: ${response.status} ${await response.text()}`);
  const body = (await response.json()) as { tasks: { id: string; status: string }[] };
  return new Map(body.tasks.map((t) => [t.id, t.status]));
}

/**
 * Polls `GET /api/tasks` until every id in `ids` satisfies `done`; returns when that happened
 * (performance.now()), estimated midway between the last poll short of it and the first one that
 * shows it, each poll dated midway between its request and its answer (when the shim read it).
 */
export async function waitStatuses(
  shim: ShimProcess,
  ids: readonly string[],
  done: (status: string | undefined) => boolean,
  options: { pollMs?: number; timeoutMs?: number } = {},
): Promise<number> {
  const deadline = performance.now() + (options.timeoutMs ?? 120_000);
  let pending = [...ids];
  let previous = performance.now();
  for (;;) {
    const asked = performance.now();
    const statuses = await taskStatuses(shim);
    const seen = (asked + performance.now()) / 2;
    pending = pending.filter((id) => !done(statuses.get(id)));
    if (pending.length === 0) return (previous + seen) / 2;
    previous = seen;
    if (seen > deadline) {
      const sample = pending.slice(0, 5).map((id) => `${id}=${statuses.get(id) ?? "absent"}`);
      throw new Error(`${pending.length} tasks did not get there in time (${sample.join(", ")})`);
    }
    await sleep(options.pollMs ?? 50);
  }
}

/**
 * Submits tasks running `command` in parallel batches of `batch`, each batch waited for until
 * `running` (a task that terminates instead is an error).
 */
export async function startTasks(
  bench: Bench,
  shim: ShimProcess,
  ids: readonly string[],
  command: readonly string[],
  batch = 25,
): Promise<void> {
  for (let i = 0; i < ids.length; i += batch) {
    const group = ids.slice(i, i + batch);
    await Promise.all(group.map((id) => shim.submit(bench.taskConfig(id, command))));
    await waitStatuses(shim, group, (s) => {
      if (s === "terminated") throw new Error("a task terminated while starting");
      return s === "running";
    });
  }
}

/**
 * How long the run waits on one list or removal of its containers: an engine that deadlocked
 * (Docker 20.10's libnetwork did, three times in B6 on 2026-12-05) fails the cleanup after its
 * retries instead of holding the run for ever.
 */
const ENGINE_CLEANUP_DEADLINE_MS = 60_000;

/** Options of a shim the harness starts. */
export interface ShimOptions {
  readonly home?: string;
  readonly port?: number;
  readonly env?: NodeJS.ProcessEnv;
  readonly waitReady?: boolean;
  /** A single binary to run instead of the bundle (B3's restarts as released). */
  readonly binary?: string;
  /** Another bundle than the run's (BENCH_SHIM_BUNDLE, else dist/taskshim.cjs). */
  readonly bundle?: string;
}

/**
 * What the views of one run share ({@link Bench.on}): its nonce, notes, the shims, processes and
 * dirs to clean up, and the engines it touched (each swept for its own `bn-<nonce>-` containers).
 */
interface RunState {
  readonly nonce: string;
  readonly notes: string[];
  readonly shims: Set<ShimProcess>;
  readonly others: Set<ChildProcess>;
  readonly dirs: Set<string>;
  readonly engines: Set<EngineTarget>;
  readonly images: Map<EngineTarget, TestImages>;
  baselineSeq: number;
}

/**
 * One benchmark run: its nonce and name prefix, the test images, the shims it started and the
 * containers and dirs it made — all removed by {@link Bench.cleanup}, and only those. A Bench
 * drives one engine ({@link Bench.engine}, Docker unless given); {@link Bench.on} gives a view of
 * the same run on another engine, whose shims, baselines and notes belong to that engine.
 */
export class Bench {
  readonly nonce: string;
  readonly prefix: string;
  readonly notes: string[];
  private readonly run: RunState;

  constructor(
    readonly quick: boolean,
    readonly engine: EngineTarget = engineTarget("docker"),
    run?: RunState,
  ) {
    this.run = run ?? {
      nonce: randomBytes(3).toString("hex"),
      notes: [],
      shims: new Set(),
      others: new Set(),
      dirs: new Set(),
      engines: new Set(),
      images: new Map(),
      baselineSeq: 0,
    };
    this.nonce = this.run.nonce;
    this.prefix = `${NAME_PREFIX}${this.nonce}-`;
    this.notes = this.run.notes;
    this.run.engines.add(engine);
  }

  /** The same run on another engine: same nonce, notes and cleanup; its own client, images and shims' engine. */
  on(engine: EngineTarget): Bench {
    return new Bench(this.quick, engine, this.run);
  }

  /** The bench's own client of this view's engine. */
  get docker(): Docker {
    return this.engine.docker;
  }

  /** The local test images on this view's engine (imported when missing; never pulled). */
  get images(): TestImages {
    const images = this.run.images.get(this.engine);
    if (!images) throw new Error(`Bench.setup() not called for ${this.engine.kind}`);
    return images;
  }

  async setup(): Promise<void> {
    await this.docker.ping();
    this.run.images.set(this.engine, await ensureTestImages(this.docker));
  }

  /** Progress on stderr, so stdout carries only the results. */
  log(message: string): void {
    process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`);
  }

  /** A detail line printed under the table (how a figure came about). */
  note(line: string): void {
    // Docker's notes read as they always did; another engine's say which one they are about.
    if (this.engine.kind !== "docker") line = `[${this.engine.kind}] ${line}`;
    this.notes.push(line);
    this.log(line);
  }

  /** A task (and container) name of this run: `bn-<nonce>-<kind>-<i>`. */
  name(kind: string, index: number | string): string {
    return `${this.prefix}${kind}-${index}`;
  }

  /** A submit body: the busybox image running `command`, host network (the shim's default). */
  taskConfig(name: string, command: readonly string[]): Record<string, unknown> {
    return { id: name, name, image_name: this.images.busybox, command };
  }

  /** A temp dir removed by the cleanup. */
  async tempDir(prefix: string): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), prefix));
    this.run.dirs.add(dir);
    return dir;
  }

  /** A dir made elsewhere (a shim home), removed by the cleanup. */
  trackDir(dir: string): Promise<void> {
    this.run.dirs.add(dir);
    return Promise.resolve();
  }

  /**
   * Starts the built shim as a child process on a new temp home (unless given), driving this
   * view's engine: `TASKSHIM_ENGINE_URL` (before `DOCKER_HOST` in the shim's choice) when the
   * engine has a URL, else the shim finds Docker as it does by default.
   */
  async startShim(options: ShimOptions = {}): Promise<ShimProcess> {
    const home = options.home ?? (await tempHome("taskshim-bench-"));
    this.run.dirs.add(home);
    const logLevel = process.env.BENCH_SHIM_LOG_LEVEL;
    const nodeOptions = process.env.BENCH_SHIM_NODE_OPTIONS;
    const env = {
      ...(this.engine.url !== undefined ? { TASKSHIM_ENGINE_URL: this.engine.url } : {}),
      ...(logLevel ? { DSTACK_SHIM_LOG_LEVEL: logLevel } : {}),
      ...(nodeOptions ? { NODE_OPTIONS: nodeOptions } : {}),
      ...options.env,
    };
    const bundle = options.bundle ?? process.env.BENCH_SHIM_BUNDLE;
    const shim = await ShimProcess.start({
      home,
      ...(bundle ? { bundle } : {}),
      ...(options.binary !== undefined ? { binary: options.binary } : {}),
      ...(options.port !== undefined ? { port: options.port } : {}),
      env,
      waitReady: false,
    });
    this.run.shims.add(shim);
    if (options.waitReady !== false) await shim.waitReady();
    return shim;
  }

  /**
   * Another process of the run (a `taskshim supervise`, spawned `detached` so that it leads its
   * own process group): SIGTERM to it in the cleanup (it forwards it), then SIGKILL to its whole
   * group if it has not exited within 15 s; SIGKILL to the group on exit.
   */
  track(child: ChildProcess): void {
    this.run.others.add(child);
    child.once("exit", () => this.run.others.delete(child));
  }

  /** `kill -9` of a shim; its containers keep running. */
  async killShim(shim: ShimProcess): Promise<void> {
    await shim.kill();
    this.run.shims.delete(shim);
    await this.keepLogs(shim);
  }

  /** Graceful stop (SIGTERM) of a shim; its containers keep running. */
  async stopShim(shim: ShimProcess): Promise<void> {
    await shim.stop().catch(() => shim.kill());
    this.run.shims.delete(shim);
    await this.keepLogs(shim);
  }

  /** With BENCH_SHIM_LOG_DIR set, each shim's output is kept there (for diagnosis). */
  private async keepLogs(shim: ShimProcess): Promise<void> {
    const dir = process.env.BENCH_SHIM_LOG_DIR;
    if (!dir) return;
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, `shim-${shim.child.pid}.log`), shim.logs);
  }

  /** Terminates (stop timeout 0) and removes tasks through the API, `limit` at a time. */
  async removeTasks(shim: ShimProcess, ids: readonly string[], limit = 16): Promise<void> {
    await pLimit(limit).map(ids, async (id) => {
      await shim.terminate(id, "terminated_by_user", "benchmark cleanup", 0);
      const removed = await shim.remove(id);
      if (removed.status !== 200 && removed.status !== 404)
        throw new Error(`remove ${id}: ${removed.status} ${removed.text}`);
    });
  }

  /**
   * The create body the shim sends for a task (same image reference, entrypoint, mounts, host
   * network, restart policy), built by the shim's own `buildContainerSpec`, with the bench label
   * instead of the shim's task labels so that no shim adopts the container.
   */
  async baselineSpec(name: string, command: readonly string[]): Promise<Docker.ContainerCreateOptions> {
    const { config } = parseTaskConfig(this.taskConfig(name, command));
    const runnerDir = join(await this.tempDir("taskshim-bench-runner-"), "runner");
    await mkdir(runnerDir, { mode: 0o755 });
    // The shim under test runs with its defaults and this process's environment.
    const params = containerParamsOf(resolveShimConfig({}));
    const spec = buildContainerSpec({
      config: { ...config, image_name: formatPullReference(parseImageReference(config.image_name)) },
      containerName: name,
      runnerDir,
      params,
      gpu: undefined,
      owner: "bench",
    });
    return { ...engineCreateBody(spec), name: spec.name, Labels: { [BENCH_LABEL]: "1" } };
  }

  /** Creates and starts a baseline container through the Engine API; returns its id. */
  async baselineRun(spec: Docker.ContainerCreateOptions): Promise<string> {
    const container = await this.docker.createContainer(spec);
    await container.start();
    return container.id;
  }

  /** A fresh baseline container name. */
  baselineName(kind: string): string {
    return this.name(`${kind}-base`, ++this.run.baselineSeq);
  }

  /** Force-removes containers by id, `limit` at a time (gone already is fine). */
  async removeContainers(ids: readonly string[], limit = 16): Promise<void> {
    await pLimit(limit).map(ids, async (id) => {
      try {
        const abortSignal = AbortSignal.timeout(ENGINE_CLEANUP_DEADLINE_MS);
        await this.docker.getContainer(id).remove({ force: true, v: true, abortSignal });
      } catch (error) {
        if (!hasStatusCode(error, 404) && !hasStatusCode(error, 409)) throw error;
      }
    });
  }

  /**
   * The containers of this run (by name prefix): every one of them was made by the run; with
   * `prefix` (one of the run's names, e.g. `name("b9", "")`), only those whose name starts so.
   */
  async ownContainers(prefix: string = this.prefix): Promise<Docker.ContainerInfo[]> {
    const listed = await this.docker.listContainers({
      all: true,
      filters: { name: [prefix] },
      abortSignal: AbortSignal.timeout(ENGINE_CLEANUP_DEADLINE_MS),
    });
    return listed.filter((c) => (c.Names ?? []).some((n) => n.replace(/^\//, "").startsWith(prefix)));
  }

  /**
   * Removes this run's containers on this view's engine, retried (the engine may be
   * restarting); the error of the last attempt, if all failed.
   */
  private async removeOwnContainers(): Promise<unknown> {
    for (let attempt = 1; ; attempt++) {
      try {
        const own = await this.ownContainers();
        if (own.length > 0) this.log(`cleanup: removing ${own.length} containers on ${this.engine.label}`);
        await this.removeContainers(own.map((c) => c.Id));
        return undefined;
      } catch (error) {
        if (attempt === 5) return error;
        this.log(`cleanup (${this.engine.label}): ${String(error)}; retrying`);
        await sleep(3_000);
      }
    }
  }

  /**
   * Stops every shim still running, removes this run's containers (on every engine of the run)
   * and temp dirs. Each step is
   * attempted even if an earlier one failed; container removal is retried (the engine may be
   * restarting). Throws the first error once everything was tried.
   */
  async cleanup(): Promise<void> {
    const errors: unknown[] = [];
    for (const shim of [...this.run.shims])
      await this.stopShim(shim).catch((error: unknown) => errors.push(error));
    await Promise.all(
      [...this.run.others].map(async (child) => {
        const exited = new Promise<void>((done) => child.once("exit", () => done()));
        child.kill("SIGTERM");
        const timer = setTimeout(() => killGroup(child), 15_000);
        await exited;
        clearTimeout(timer);
      }),
    );
    for (const engine of [...this.run.engines]) {
      const error = await (engine === this.engine ? this : this.on(engine)).removeOwnContainers();
      if (error !== undefined) errors.push(error);
    }
    for (const dir of this.run.dirs)
      await rm(dir, { recursive: true, force: true }).catch((e: unknown) => errors.push(e));
    this.run.dirs.clear();
    if (errors.length > 0) throw errors[0] instanceof Error ? errors[0] : new Error(String(errors[0]));
  }

  /** SIGKILLs every shim still running (process exit path; containers are swept by cleanup). */
  killAllNow(): void {
    for (const shim of this.run.shims) shim.child.kill("SIGKILL");
    for (const child of this.run.others) killGroup(child);
  }
}

/** SIGKILL to the process group `child` leads (a supervisor, its inner supervisor and its shim). */
function killGroup(child: ChildProcess): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, "SIGKILL");
  } catch {
    // gone already
  }
}

/**
 * Removes the `bn-` containers of earlier, aborted runs (`npm run bench -- --sweep`): task
 * containers of a shim named `bn-…` and containers with the bench label. Opt-in, because a
 * benchmark running at the same time would lose its containers.
 */
export async function sweepStale(docker: Docker): Promise<number> {
  const [tasks, labelled] = await Promise.all([
    docker.listContainers({ all: true, filters: { label: ["ai.dstack.shim.is-task=true"] } }),
    docker.listContainers({ all: true, filters: { label: [`${BENCH_LABEL}=1`] } }),
  ]);
  const ids = new Set(
    [...tasks, ...labelled]
      .filter((c) => (c.Names ?? []).some((n) => n.replace(/^\//, "").startsWith(NAME_PREFIX)))
      .map((c) => c.Id),
  );
  await pLimit(16).map([...ids], async (id) => {
    try {
      await docker.getContainer(id).remove({ force: true, v: true });
    } catch (error) {
      if (!hasStatusCode(error, 404) && !hasStatusCode(error, 409)) throw error;
    }
  });
  return ids.size;
}
