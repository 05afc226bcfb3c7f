import { execFile } from "node:child_process";
import { chown, mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { expect } from "vitest";
import {
  CHAOS_PREFIX,
  type ChaosHost,
  containerNameFor,
  FIXTURE_GPUS,
  KEY_MARKER,
  keyBlob,
  LABEL_IS_TASK,
  LABEL_TASK_ID,
  type LoopVolume,
  makeHostKey,
  mountsUnder,
  volumeConfig,
} from "./chaos-host.js";
import { startDockerProxy, type DockerProxy } from "./chaos-docker-proxy.js";
import { testDocker } from "./docker.js";
import { ShimProcess, type Answer, type TaskInfo } from "./shim-process.js";

const execFileAsync = promisify(execFile);

/*
 * One chaos scenario: a shim home with its own host user (authorized_keys with hand-written
 * lines), its own volume mount root, its own view of the engine (chaos-docker-proxy.ts), a
 * tracker that watches every answer the shim gives and every container sighting, and the
 * oracle of restart-anchors §9.1 (I1, I2, I3 as set equalities, I5/I8, I6).
 *
 * The tracker keeps its own books and trusts nothing the shim says: what each task's workload
 * was programmed to do (its {@link Fate}), every fault the test itself caused (a terminate with
 * its reason, a remove, a container removed, restarted or started from outside), every
 * container id seen for the task (API and Docker) and how often the workload really started
 * (it appends a line to `/tmp/runner/starts` each time). Each terminal status is judged
 * against those books, never against another answer of the shim.
 */

/**
 * The counters of the summary line; `other` holds violations the line has no column for.
 *
 * - `lost`: a task answered 200 that is no longer listed (and was not removed), a status that
 *   went back from running or terminated, a terminal reason or message that changed, a live
 *   task whose container is gone.
 * - `wrong_exit`: a terminal status the tracker's books contradict: an invalid reason; an
 *   exit-based reason (`done_by_runner`, `container_exited_with_error`) whose exit code is not
 *   the programmed one, or for a workload that was never told to exit; `executor_error`
 *   "container not found" where the test removed no container; `creating_container_error` or
 *   another start failure where a container of the task ran; a control-plane reason no
 *   terminate asked for.
 * - `restarted_containers`: a second container id for one task (from the API or Docker, the
 *   first sighting included), a changed StartedAt or a RestartCount above 0, or a workload that
 *   started more often than the test itself restarted it.
 * - `leaked_*`: GPUs, host keys, mounts, task dirs or containers held by no live task (or
 *   missing for a live one), as the I3 set equalities define them.
 */
export type Category =
  | "lost"
  | "wrong_exit"
  | "leaked_gpus"
  | "leaked_keys"
  | "leaked_mounts"
  | "leaked_dirs"
  | "leaked_containers"
  | "restarted_containers"
  | "other";

const SUMMARY_COLUMNS = [
  "lost",
  "wrong_exit",
  "leaked_gpus",
  "leaked_keys",
  "leaked_mounts",
  "leaked_dirs",
  "leaked_containers",
  "restarted_containers",
] as const;

/** Suite-wide counters behind the summary line. */
export class ChaosStats {
  scenarios = 0;
  kills = 0;
  tasks = 0;
  /** Storage faults injected (test/storage-faults.test.ts); shown when any were. */
  storageFaults = 0;
  readonly counts: Record<Category, number> = {
    lost: 0,
    wrong_exit: 0,
    leaked_gpus: 0,
    leaked_keys: 0,
    leaked_mounts: 0,
    leaked_dirs: 0,
    leaked_containers: 0,
    restarted_containers: 0,
    other: 0,
  };

  /** The one summary line. */
  summary(): string {
    const columns = SUMMARY_COLUMNS.map((c) => `${c}=${this.counts[c]}`).join(" ");
    const storage = this.storageFaults > 0 ? ` storage_faults=${this.storageFaults}` : "";
    return `chaos: scenarios=${this.scenarios} kills=${this.kills} tasks=${this.tasks}${storage} ${columns}`;
  }

  /** Sum of every violation counter (summary columns and `other`). */
  violations(): number {
    return Object.values(this.counts).reduce((a, b) => a + b, 0);
  }
}

/**
 * The termination reasons a dstack server accepts (`JobTerminationReason`, lower case). Kept
 * apart from src/ on purpose: the oracle must not trust the list of the code it checks.
 */
const VALID_REASONS: ReadonlySet<string> = new Set([
  "executor_error",
  "creating_container_error",
  "container_exited_with_error",
  "done_by_runner",
  "terminated_by_user",
  "terminated_by_server",
  "max_duration_exceeded",
  "log_quota_exceeded",
  "failed_to_start_due_to_no_capacity",
  "interrupted_by_no_capacity",
  "instance_unreachable",
  "waiting_instance_limit_exceeded",
  "waiting_runner_limit_exceeded",
  "ports_binding_failed",
  "aborted_by_user",
  "scaled_down",
  "inactivity_duration_exceeded",
  "terminated_due_to_utilization_policy",
  "gateway_error",
  "instance_access_revoked",
  "volume_error",
]);

const STATUS_RANK: Readonly<Record<string, number>> = {
  pending: 0,
  preparing: 1,
  pulling: 2,
  creating: 3,
  running: 4,
  terminated: 5,
};
const PRE_CONTAINER = new Set(["pending", "preparing", "pulling", "creating"]);
const NEVER_STARTED = "0001-01-01T00:00:00Z";

/**
 * What a task's workload was programmed to do, recorded by the test when it builds the task:
 * exit with `code` once the test sends `go` (the default workload) or on its own, be killed by
 * the kernel for its memory limit (`oom`: exit 137), or run until it is told to stop.
 */
export type Fate =
  | { readonly kind: "exits"; readonly code: number; readonly trigger: "go" | "self"; readonly oom?: boolean }
  | { readonly kind: "runs-until-told" };

/** The shim's own termination reasons that say the workload exited by itself. */
const EXIT_BASED: ReadonlySet<string> = new Set(["done_by_runner", "container_exited_with_error"]);
/** The shim's own reasons for a task whose start failed before a container ran. */
const START_FAILURES: ReadonlySet<string> = new Set(["creating_container_error", "executor_error"]);
const CONTAINER_NOT_FOUND = "container not found";

/** A submit body the suite sends (a dstack-shim TaskConfig plus taskshim's `command`). */
export interface ChaosTaskConfig {
  readonly id: string;
  readonly name: string;
  readonly image_name: string;
  readonly command?: readonly string[];
  readonly gpu?: number;
  readonly memory?: number;
  readonly host_ssh_user?: string;
  readonly host_ssh_keys?: readonly string[];
  readonly volumes?: readonly Record<string, unknown>[];
  readonly registry_username?: string;
  readonly registry_password?: string;
}

/** What the tracker knows about one task. */
export interface TrackedTask {
  readonly config: ChaosTaskConfig;
  readonly containerName: string;
  /** A submit was answered 200, or the shim listed the task. */
  answered: boolean;
  removed: "no" | "yes" | "maybe";
  terminateRequested: boolean;
  /** Its task.json was quarantined: the shim cannot know its keys or volumes. */
  degraded: boolean;
  maxRank: number;
  terminal?: { readonly reason: string; readonly message: string };
  containerId?: string;
  /** Seen terminated with an exit-based reason while its container still told the same. */
  exitConfirmed: boolean;
  /** A remove was sent (maybe cut by a kill): its container may be gone for a good reason. */
  removeAttempted: boolean;
  // ---- the tracker's own books: what the test programmed and caused, never the shim's word
  /** What the workload was programmed to do. */
  readonly fate: Fate;
  /** The test created `runner/go` (the default workload then exits with its code). */
  goSent: boolean;
  /** Every termination reason a terminate of this task asked for. */
  readonly terminateReasons: Set<string>;
  /** The test itself removed the task's container (`docker rm -f` from outside). */
  containerRemovedByTest: boolean;
  /** How many times the test itself restarted the task's container. */
  restartsByTest: number;
  /** Every container id seen for the task, from the API and from Docker. */
  readonly containerIds: Set<string>;
  /** A container of the task ran (seen running, started, or the workload recorded a start). */
  ran: boolean;
  /** Violations already counted for this task (each rule counts once per task). */
  readonly flagged: Set<string>;
}

/** A scenario container as Docker reports it. */
export interface ChaosContainer {
  readonly id: string;
  readonly name: string;
  readonly taskId: string;
  readonly state: string;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  readonly startedAt: string;
  readonly restartCount: number;
  readonly gpuDevices: readonly string[];
}

/** The parsed task.json (the fields the oracle reads). */
export interface ChaosTaskState {
  readonly status?: string;
  readonly termination_reason: string;
  readonly termination_message: string;
  readonly cleaned_up: boolean;
  readonly exit_code?: number | null;
  readonly [key: string]: unknown;
}

/** Options of a task built by {@link Scenario.task}. */
export interface TaskOptions {
  /** The argv; default: wait for `/tmp/runner/go`, print five lines and exit with `exit`. */
  readonly command?: readonly string[];
  readonly exit?: number;
  readonly gpu?: number;
  readonly keys?: readonly string[];
  readonly volumes?: readonly LoopVolume[];
  readonly memory?: number;
  readonly image?: string;
  readonly registry?: { readonly username: string; readonly password: string };
  /** What a custom `command` does (required with one: the oracle judges the exit by it). */
  readonly fate?: Fate;
}

/** The hand-written authorized_keys every scenario user starts with (no final newline). */
const HAND_WRITTEN = [
  "# keys of the admin, kept by hand",
  `from="10.0.0.0/8" ${makeHostKey("admin@bastion")}`,
  makeHostKey("ops laptop"),
];
const HOST_UID = 4242;

/** The default workload: waits for `<task dir>/runner/go`, ticks while waiting, then exits. */
export function waitCommand(exit: number, before = ""): string[] {
  return [
    "sh",
    "-c",
    "echo start; i=0; while [ ! -e /tmp/runner/go ]; do i=$((i+1)); " +
      'if [ $((i % 10)) -eq 0 ]; then echo "tick $i"; fi; sleep 0.05; done; ' +
      `${before}echo l1; echo l2; echo l3; echo l4; echo bye; exit ${exit}`,
  ];
}

/** The last five lines the default workload prints. */
export const WAIT_TASK_TAIL = "l1\nl2\nl3\nl4\nbye";

/** Where a workload records each of its starts (in its task dir's mounted `runner/`). */
const STARTS_FILE = "starts";

/** A `sh -c` argv that first appends a line to `/tmp/runner/starts`; other argvs unchanged. */
function recordingStarts(command: readonly string[]): readonly string[] {
  const [shell, flag, script, ...rest] = command;
  if (shell !== "sh" || flag !== "-c" || script === undefined) return command;
  return [shell, flag, `echo started >> /tmp/runner/${STARTS_FILE}; ${script}`, ...rest];
}

export class Scenario {
  readonly prefix: string;
  readonly dir: string;
  readonly home: string;
  readonly userHome: string;
  readonly keysFile: string;
  readonly passwdFile: string;
  readonly mountRoot: string;
  readonly user = "cxuser";
  readonly tracked = new Map<string, TrackedTask>();
  /** Container names of labelled containers made by hand (W3): not leaks. */
  readonly strays = new Set<string>();
  /** Containers the test itself restarted (W2). */
  readonly externallyRestarted = new Set<string>();
  readonly violations: string[] = [];
  shim: ShimProcess | undefined;
  private readonly startedAt = new Map<string, string>();
  /** The fate of every task built by {@link task}, by id. */
  private readonly fates = new Map<string, Fate>();
  private readonly processes: ShimProcess[] = [];
  private proxy: DockerProxy | undefined;
  private seq = 0;

  private constructor(
    readonly host: ChaosHost,
    readonly stats: ChaosStats,
    readonly tag: string,
    readonly image: string,
  ) {
    this.prefix = `${CHAOS_PREFIX}${host.nonce}-${tag}-`;
    this.dir = join(host.root, tag);
    this.home = join(this.dir, "home");
    this.userHome = join(this.dir, "user");
    this.keysFile = join(this.userHome, ".ssh", "authorized_keys");
    this.passwdFile = join(this.dir, "passwd");
    this.mountRoot = join(this.dir, "mnt");
  }

  /** A scenario dir with its user (passwd entry, ~/.ssh/authorized_keys with hand-written lines). */
  static async create(host: ChaosHost, stats: ChaosStats, tag: string, image: string): Promise<Scenario> {
    const s = new Scenario(host, stats, tag, image);
    await mkdir(join(s.userHome, ".ssh"), { recursive: true, mode: 0o700 });
    await mkdir(s.mountRoot, { recursive: true });
    await writeFile(
      s.passwdFile,
      `root:x:0:0:root:/root:/bin/sh\n${s.user}:x:${HOST_UID}:${HOST_UID}::${s.userHome}:/bin/sh\n`,
    );
    await writeFile(s.keysFile, HAND_WRITTEN.join("\n"), { mode: 0o600 });
    await chown(s.keysFile, HOST_UID, HOST_UID);
    s.proxy = await startDockerProxy(join(s.dir, "docker.sock"), (name) => name.startsWith(s.prefix));
    return s;
  }

  // ---------------------------------------------------------------- shim lifecycle

  /**
   * Starts a shim on the scenario home (failpoints armed if given) and waits for health,
   * unless `waitReady` is false (a failpoint may kill it during its startup).
   */
  async start(failpoints = "", options: { waitReady?: boolean } = {}): Promise<ShimProcess> {
    if (this.alive()) throw new Error(`${this.tag}: a shim is already running`);
    const shim = await ShimProcess.start({
      waitReady: options.waitReady ?? true,
      bundle: this.host.bundle,
      home: this.home,
      args: [
        "--gpu-fixture",
        this.host.gpuFixture,
        "--volume-mount-root",
        this.mountRoot,
        // No binary to version-check: saves a child process per start.
        "--shim-binary-path",
        join(this.dir, "no-shim-binary"),
      ],
      env: {
        // The scenario's view of the engine: only its own containers (see chaos-docker-proxy).
        DOCKER_HOST: this.proxy?.dockerHost ?? "",
        TASKSHIM_FAILPOINTS: failpoints,
        TASKSHIM_PASSWD_FILE: this.passwdFile,
        TASKSHIM_DISK_BY_ID_DIR: this.host.byIdDir,
        TASKSHIM_BOOT_ID_FILE: this.host.bootIdFile,
      },
    });
    this.shim = shim;
    this.processes.push(shim);
    return shim;
  }

  /** Whether the current shim process is still alive. */
  alive(): boolean {
    const child = this.shim?.child;
    return child !== undefined && child.exitCode === null && child.signalCode === null;
  }

  /** The running shim (throws when there is none). */
  get api(): ShimProcess {
    if (!this.shim) throw new Error(`${this.tag}: no shim`);
    return this.shim;
  }

  /** SIGKILL, counted. */
  async kill(): Promise<void> {
    if (!this.alive()) return;
    await this.api.kill();
    this.stats.kills += 1;
  }

  /** Waits for the shim to SIGKILL itself at an armed failpoint; counted. */
  async died(timeoutMs = 20_000): Promise<void> {
    await this.api.waitExit(timeoutMs);
    expect(this.api.child.signalCode, `${this.tag}: the shim should have been SIGKILLed`).toBe("SIGKILL");
    this.stats.kills += 1;
  }

  /**
   * Starts the shim again without failpoints and checks, from the very first answers, that no
   * answered task was lost and no terminal status changed (the tracker's I5/I6 checks).
   */
  async restart(): Promise<ShimProcess> {
    const shim = await this.start();
    const infos = await this.list();
    const seen = new Set(infos.map((i) => i.id));
    for (const t of this.tracked.values()) {
      if (t.answered && t.removed === "no" && !seen.has(t.config.id)) {
        this.violation("lost", `${t.config.id}: answered with 200 but missing after the restart`);
      }
    }
    return shim;
  }

  /**
   * Ends the scenario: kills its shims and removes its containers and mounts, so the next
   * scenario's shim does not adopt them. Idempotent.
   */
  async close(): Promise<void> {
    for (const p of this.processes) {
      if (p.child.exitCode === null && p.child.signalCode === null) await p.kill().catch(() => undefined);
    }
    const docker = testDocker();
    const listed = await docker.listContainers({ all: true });
    for (const c of listed) {
      if (!(c.Names ?? []).some((n) => n.replace(/^\//, "").startsWith(this.prefix))) continue;
      await docker
        .getContainer(c.Id)
        .remove({ force: true, v: true })
        .catch(() => undefined);
    }
    for (const point of (await this.mounts()).reverse()) {
      await execFileAsync("umount", ["-l", point]).catch(() => undefined);
    }
    await this.proxy?.stop();
    this.proxy = undefined;
  }

  // ---------------------------------------------------------------- tasks

  /** A task config with a fresh `cx-` id and name; not submitted. */
  task(options: TaskOptions = {}): ChaosTaskConfig {
    this.seq += 1;
    const id = `${this.prefix}${this.seq}`;
    const keys = options.keys ?? [];
    const volumes = options.volumes ?? [];
    if (options.command !== undefined && options.fate === undefined) {
      throw new Error(`${this.tag}: a task with its own command needs its programmed fate`);
    }
    this.fates.set(id, options.fate ?? { kind: "exits", code: options.exit ?? 0, trigger: "go" });
    return {
      id,
      name: id,
      image_name: options.image ?? this.image,
      command: recordingStarts(options.command ?? waitCommand(options.exit ?? 0)),
      ...(options.gpu !== undefined ? { gpu: options.gpu } : {}),
      ...(options.memory !== undefined ? { memory: options.memory } : {}),
      ...(keys.length > 0 ? { host_ssh_user: this.user, host_ssh_keys: keys } : {}),
      ...(volumes.length > 0 ? { volumes: volumes.map(volumeConfig) } : {}),
      ...(options.registry
        ? { registry_username: options.registry.username, registry_password: options.registry.password }
        : {}),
    };
  }

  /** Starts tracking a config (before it is sent, so an unanswered submit is known). */
  track(config: ChaosTaskConfig): TrackedTask {
    const existing = this.tracked.get(config.id);
    if (existing) return existing;
    const t: TrackedTask = {
      config,
      containerName: containerNameFor(config.name, config.id),
      answered: false,
      removed: "no",
      terminateRequested: false,
      degraded: false,
      maxRank: -1,
      exitConfirmed: false,
      removeAttempted: false,
      fate: this.fates.get(config.id) ?? { kind: "runs-until-told" },
      goSent: false,
      terminateReasons: new Set(),
      containerRemovedByTest: false,
      restartsByTest: 0,
      containerIds: new Set(),
      ran: false,
      flagged: new Set(),
    };
    this.tracked.set(config.id, t);
    this.stats.tasks += 1;
    return t;
  }

  /** The tracked task (throws when unknown). */
  entry(id: string): TrackedTask {
    const t = this.tracked.get(id);
    if (!t) throw new Error(`${this.tag}: untracked task ${id}`);
    return t;
  }

  /** Submits and expects 200. */
  async submit(config: ChaosTaskConfig): Promise<TaskInfo> {
    const t = this.track(config);
    const info = await this.api.submit({ ...config });
    t.answered = true;
    this.observe(info);
    return info;
  }

  /** Submits; resolves to the answer, or undefined when the shim died before answering. */
  async trySubmit(config: ChaosTaskConfig): Promise<Answer<TaskInfo> | undefined> {
    const t = this.track(config);
    try {
      const answer = await this.api.request<TaskInfo>("POST", "/api/tasks", { ...config });
      if (answer.status === 200) {
        t.answered = true;
        this.observe(answer.json);
      }
      return answer;
    } catch {
      return undefined;
    }
  }

  /** Lets a default workload finish: creates `<task dir>/runner/go` from the host. */
  async go(id: string): Promise<void> {
    const t = this.entry(id);
    const runner = join(this.home, "runners", t.containerName, "runner");
    await writeFile(join(runner, "go"), "");
    t.goSent = true;
  }

  // ---------------------------------------------------------------- faults the test causes

  /** The tracked task a container belongs to (by its task id label), if any. */
  private async ownerOf(containerId: string): Promise<TrackedTask | undefined> {
    const info = await testDocker().getContainer(containerId).inspect();
    return this.tracked.get(info.Config.Labels?.[LABEL_TASK_ID] ?? "");
  }

  /** `docker rm -f` from outside the shim, recorded first (W1). */
  async removeContainer(containerId: string): Promise<void> {
    const t = await this.ownerOf(containerId);
    if (t) t.containerRemovedByTest = true;
    await testDocker().getContainer(containerId).remove({ force: true });
  }

  /** `docker restart` from outside the shim, recorded first (W2). */
  async restartContainer(containerId: string): Promise<void> {
    const t = await this.ownerOf(containerId);
    if (t) t.restartsByTest += 1;
    this.externallyRestarted.add(containerId);
    await testDocker().getContainer(containerId).restart({ t: 0 });
  }

  /**
   * `docker start` of a `created` container from outside, standing in for a killed shim's late
   * start request: the one start the container may have, so it is not counted as a restart.
   */
  async startContainer(containerId: string): Promise<void> {
    await testDocker().getContainer(containerId).start();
  }

  /** GET one task (observed), or undefined on 404. */
  async get(id: string): Promise<TaskInfo | undefined> {
    const answer = await this.api.request<TaskInfo>("GET", `/api/tasks/${id}`);
    if (answer.status === 404) return undefined;
    if (answer.status !== 200) throw new Error(`get ${id}: ${answer.status} ${answer.text}`);
    this.observe(answer.json);
    return answer.json;
  }

  /** GET one task that must exist. */
  async must(id: string): Promise<TaskInfo> {
    const info = await this.get(id);
    if (!info) throw new Error(`${this.tag}: task ${id} not found`);
    return info;
  }

  /** Polls a task until `predicate` holds. */
  async waitFor(id: string, predicate: (t: TaskInfo) => boolean, timeoutMs = 20_000): Promise<TaskInfo> {
    const deadline = Date.now() + timeoutMs;
    let last: TaskInfo | undefined;
    while (Date.now() < deadline) {
      last = await this.get(id);
      if (last && predicate(last)) return last;
      await sleep(25);
    }
    throw new Error(`${this.tag}: task ${id} did not reach the expected state; last ${JSON.stringify(last)}`);
  }

  waitRunning(id: string, timeoutMs?: number): Promise<TaskInfo> {
    return this.waitFor(id, (t) => t.status === "running", timeoutMs);
  }

  waitTerminated(id: string, timeoutMs?: number): Promise<TaskInfo> {
    return this.waitFor(id, (t) => t.status === "terminated", timeoutMs);
  }

  /**
   * Every task of this scenario the shim lists, each fetched and observed. A shim owns every
   * labelled container on its engine, so it also adopts (as legacy tasks) the containers of
   * other homes — earlier scenarios, other test files; those are not this scenario's business.
   */
  async list(): Promise<TaskInfo[]> {
    const answer = await this.api.request<{ tasks: { id: string }[] }>("GET", "/api/tasks");
    if (answer.status !== 200) throw new Error(`list: ${answer.status} ${answer.text}`);
    const infos: TaskInfo[] = [];
    for (const { id } of answer.json.tasks) {
      if (!id.startsWith(this.prefix)) continue;
      const info = await this.get(id);
      if (info) infos.push(info);
    }
    return infos;
  }

  /** POST terminate (recorded before it is sent); undefined when the shim died first. */
  async terminate(
    id: string,
    reason = "terminated_by_user",
    message = "",
    timeout = 0,
  ): Promise<Answer<TaskInfo> | undefined> {
    const t = this.entry(id);
    t.terminateRequested = true;
    t.terminateReasons.add(reason.toLowerCase());
    try {
      const answer = await this.api.terminate(id, reason, message, timeout);
      if (answer.status === 200) this.observe(answer.json);
      return answer;
    } catch {
      return undefined;
    }
  }

  /** POST remove; tracks the outcome. Undefined when the shim died first. */
  async remove(id: string): Promise<Answer | undefined> {
    const t = this.entry(id);
    // The task dir (with the workload's record of its starts) goes with the task: read it now.
    await this.checkStarts(t);
    const state = await this.readState(id);
    if (t.terminal && state) this.judgeExit(t, t.terminal.reason, undefined, state);
    const before = t.removed;
    t.removed = "maybe";
    t.removeAttempted = true;
    try {
      const answer = await this.api.remove(id);
      t.removed = answer.status === 200 ? "yes" : before;
      return answer;
    } catch {
      return undefined;
    }
  }

  /** Terminates (if needed) and removes a task, expecting both to succeed. */
  async finish(id: string): Promise<void> {
    const info = await this.get(id);
    if (!info) return;
    if (info.status !== "terminated") expect((await this.terminate(id))?.status).toBe(200);
    expect((await this.remove(id))?.status).toBe(200);
  }

  /** The task's dir under `<home>/runners`. */
  taskDir(id: string): string {
    return join(this.home, "runners", this.entry(id).containerName);
  }

  /** task.json of a task, or undefined when missing or unreadable. */
  async readState(id: string): Promise<ChaosTaskState | undefined> {
    try {
      return JSON.parse(await readFile(join(this.taskDir(id), "task.json"), "utf8")) as ChaosTaskState;
    } catch {
      return undefined;
    }
  }

  /** Waits until task.json holds `status` (the API may show a status before it is durable). */
  async waitPersisted(id: string, status: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if ((await this.readState(id))?.status === status) return;
      await sleep(10);
    }
    throw new Error(`${this.tag}: task ${id} not persisted as ${status} within ${timeoutMs} ms`);
  }

  /** Waits until task.json says the task's resources were released. */
  async waitReleased(id: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if ((await this.readState(id))?.cleaned_up === true) return;
      await sleep(25);
    }
    throw new Error(`${this.tag}: task ${id} not released within ${timeoutMs} ms`);
  }

  // ---------------------------------------------------------------- host views

  /** The scenario's labelled containers (by name prefix), inspected. */
  async containers(): Promise<ChaosContainer[]> {
    const docker = testDocker();
    const listed = await docker.listContainers({ all: true, filters: { label: [LABEL_IS_TASK] } });
    const ours = listed.filter((c) =>
      (c.Names ?? []).some((n) => n.replace(/^\//, "").startsWith(this.prefix)),
    );
    const result: ChaosContainer[] = [];
    for (const c of ours) {
      let info;
      try {
        info = await docker.getContainer(c.Id).inspect();
      } catch {
        continue; // removed meanwhile
      }
      result.push({
        id: info.Id,
        name: info.Name.replace(/^\//, ""),
        taskId: info.Config.Labels?.[LABEL_TASK_ID] ?? "",
        state: info.State.Status,
        exitCode: info.State.ExitCode,
        oomKilled: info.State.OOMKilled,
        startedAt: info.State.StartedAt,
        restartCount: info.RestartCount,
        gpuDevices: ((info.HostConfig.Devices ?? []) as { PathInContainer?: string }[])
          .map((d) => d.PathInContainer ?? "")
          .filter((p) => p.startsWith("/dev/dri/render")),
      });
    }
    this.checkContainers(result);
    return result;
  }

  /** The containers of one task. */
  async containersOf(id: string): Promise<ChaosContainer[]> {
    return (await this.containers()).filter((c) => c.taskId === id);
  }

  /** The marked key blobs (in file order) and the unmarked lines of the user's authorized_keys. */
  async keyEntries(): Promise<{ marked: string[]; unmarked: string[]; raw: Buffer }> {
    const raw = await readFile(this.keysFile);
    const lines = raw.toString("utf8").split("\n");
    if (lines.at(-1) === "") lines.pop();
    const isMarked = (line: string): boolean => line.replace(/[ \t\r]+$/, "").endsWith(` ${KEY_MARKER}`);
    return {
      marked: lines.filter(isMarked).map(keyBlob),
      unmarked: lines.filter((l) => !isMarked(l)),
      raw,
    };
  }

  /** The mount point of a pool volume under this scenario's mount root. */
  mountPoint(volume: LoopVolume): string {
    return join(this.mountRoot, `cx-vol${volume.index}`);
  }

  /** Mount points under the scenario's mount root (duplicates = stacked mounts). */
  mounts(): Promise<string[]> {
    return mountsUnder(this.mountRoot);
  }

  /** The I3 checks on keys that need no shim: the file is never empty, hand lines intact. */
  async checkKeysFile(context: string): Promise<{ marked: string[] }> {
    const { marked, unmarked, raw } = await this.keyEntries();
    if (raw.length === 0) this.violation("leaked_keys", `${context}: authorized_keys is empty`);
    if (JSON.stringify(unmarked) !== JSON.stringify(HAND_WRITTEN)) {
      this.violation("leaked_keys", `${context}: hand-written lines changed: ${JSON.stringify(unmarked)}`);
    }
    const st = await stat(this.keysFile);
    if ((st.mode & 0o777) !== 0o600 || st.uid !== HOST_UID || st.gid !== HOST_UID) {
      this.violation(
        "other",
        `${context}: authorized_keys mode/owner changed: ${(st.mode & 0o777).toString(8)} ${st.uid}:${st.gid}`,
      );
    }
    const dups = marked.length - new Set(marked).size;
    if (dups > 0) this.violation("leaked_keys", `${context}: ${dups} duplicated marked key line(s)`);
    return { marked };
  }

  /** Stray task-state temp files and the keys temp file (U6, S3). */
  async tempFiles(): Promise<string[]> {
    const found: string[] = [];
    const runners = join(this.home, "runners");
    for (const name of await readdir(runners).catch(() => [] as string[])) {
      for (const file of await readdir(join(runners, name)).catch(() => [] as string[])) {
        if (file.startsWith(".task.json.tmp-")) found.push(join(runners, name, file));
      }
    }
    for (const file of await readdir(join(this.userHome, ".ssh"))) {
      if (file !== "authorized_keys") found.push(join(this.userHome, ".ssh", file));
    }
    return found;
  }

  // ---------------------------------------------------------------- tracker

  /** Records a violation: counted for the summary, reported by the next oracle. */
  violation(category: Category, message: string): void {
    this.stats.counts[category] += 1;
    this.violations.push(`[${category}] ${message}`);
  }

  /** Watches one answer: statuses never go back, terminal states never change (I5/I8). */
  observe(info: TaskInfo): void {
    const t = this.tracked.get(info.id);
    if (!t) {
      if (!this.strays.has(info.container_name))
        this.violation("other", `${info.id}: a task nobody submitted`);
      return;
    }
    t.answered = true;
    const rank = STATUS_RANK[info.status] ?? -1;
    if (rank < 0) this.violation("other", `${info.id}: unknown status ${info.status}`);
    // Pre-container statuses may be shown a moment before they are durable; running and
    // terminated never go back.
    const regressed = rank < t.maxRank && t.maxRank >= STATUS_RANK.running!;
    if (regressed) {
      this.violation("lost", `${info.id}: status went back to ${info.status} (rank ${t.maxRank} seen)`);
      t.maxRank = rank; // reported once, not on every later answer
    }
    t.maxRank = Math.max(t.maxRank, rank);
    if (t.terminal) {
      if (regressed) {
        delete t.terminal;
      } else if (
        info.termination_reason !== t.terminal.reason ||
        info.termination_message !== t.terminal.message
      ) {
        this.violation(
          "lost",
          `${info.id}: terminal state changed from ${JSON.stringify(t.terminal)} to ` +
            `${JSON.stringify({ reason: info.termination_reason, message: info.termination_message })}`,
        );
        t.terminal = { reason: info.termination_reason, message: info.termination_message };
      }
    } else if (info.status === "terminated") {
      t.terminal = { reason: info.termination_reason, message: info.termination_message };
    }
    if (info.container_id !== "") {
      this.sawContainer(t, info.container_id, "the API");
      if (info.status === "running") t.ran = true;
      t.containerId = info.container_id;
    }
    if (info.status === "terminated") this.judgeReason(t, info.termination_reason, info.termination_message);
  }

  /** Counts a violation once per task and rule. */
  private flag(t: TrackedTask, rule: string, category: Category, message: string): void {
    if (t.flagged.has(rule)) return;
    t.flagged.add(rule);
    this.violation(category, `${t.config.id}: ${message}`);
  }

  /** Every id ever seen for a task: a second one is a replaced container, however it was seen. */
  private sawContainer(t: TrackedTask, id: string, source: string): void {
    if (t.containerIds.has(id)) return;
    if (t.containerIds.size > 0) {
      const earlier = [...t.containerIds].map((x) => x.slice(0, 12)).join(",");
      this.violation(
        "restarted_containers",
        `${t.config.id}: a second container ${id.slice(0, 12)} (after ${earlier}), seen through ${source}`,
      );
    }
    t.containerIds.add(id);
  }

  /**
   * Judges a terminal reason against the books alone: an exit-based reason needs a workload
   * programmed to exit that way and told to; "container not found" needs the test to have
   * removed the container; a start failure needs that no container ever ran; any other reason
   * must be one a terminate asked for.
   */
  private judgeReason(t: TrackedTask, reason: string, message: string): void {
    if (!VALID_REASONS.has(reason)) {
      this.flag(t, "reason", "wrong_exit", `invalid reason ${JSON.stringify(reason)}`);
      return;
    }
    const fate = t.fate;
    if (EXIT_BASED.has(reason)) {
      if (fate.kind === "runs-until-told") {
        this.flag(t, "reason", "wrong_exit", `reported ${reason}, but its workload runs until told`);
      } else if (fate.trigger === "go" && !t.goSent) {
        this.flag(t, "reason", "wrong_exit", `reported ${reason}, but its workload was never told to exit`);
      } else if (reason !== (fate.code === 0 ? "done_by_runner" : "container_exited_with_error")) {
        this.flag(t, "reason", "wrong_exit", `reported ${reason}, but its workload exits ${fate.code}`);
      }
    } else if (reason === "executor_error" && message === CONTAINER_NOT_FOUND) {
      if (!t.containerRemovedByTest) {
        this.flag(t, "reason", "wrong_exit", `"${CONTAINER_NOT_FOUND}", but the test removed no container`);
      }
    } else if (START_FAILURES.has(reason)) {
      if (t.ran) this.flag(t, "reason", "wrong_exit", `${reason} (${message}), but a container of it ran`);
    } else if (!t.terminateReasons.has(reason)) {
      this.flag(t, "reason", "wrong_exit", `reported ${reason}, which no terminate asked for`);
    }
  }

  /**
   * Judges the exit code of an exit-based terminal status: the container's (when it is still
   * there) and task.json's must both be the programmed one (137 for an OOM kill).
   */
  private judgeExit(
    t: TrackedTask,
    reason: string,
    container: ChaosContainer | undefined,
    state: ChaosTaskState | undefined,
  ): void {
    if (!EXIT_BASED.has(reason) || t.fate.kind !== "exits") return;
    const programmed = t.fate.code;
    const exited = container !== undefined && (container.state === "exited" || container.state === "dead");
    if (exited && container.exitCode !== programmed) {
      this.flag(
        t,
        "exit",
        "wrong_exit",
        `its container exited ${container.exitCode}, programmed ${programmed}`,
      );
    }
    if (typeof state?.exit_code === "number" && state.exit_code !== programmed) {
      this.flag(
        t,
        "exit",
        "wrong_exit",
        `task.json says exit code ${state.exit_code}, programmed ${programmed}`,
      );
    }
    if (exited && t.fate.oom === true && !container.oomKilled) {
      this.flag(t, "exit", "wrong_exit", "programmed to be OOM-killed, but its container was not");
    }
  }

  /**
   * How often the workload started, from its own record in the task dir: more than once (plus
   * the restarts the test caused) is a restarted or replaced container, even one never seen.
   */
  private async checkStarts(t: TrackedTask): Promise<void> {
    let text: string;
    try {
      text = await readFile(join(this.home, "runners", t.containerName, "runner", STARTS_FILE), "utf8");
    } catch {
      return;
    }
    const starts = text.split("\n").filter((l) => l === "started").length;
    if (starts > 0) t.ran = true;
    const allowed = 1 + t.restartsByTest;
    if (starts > allowed) {
      this.flag(
        t,
        `starts-${starts}`,
        "restarted_containers",
        `its workload started ${starts} times; the test restarted it ${t.restartsByTest} time(s)`,
      );
    }
  }

  /** I6 on every sighting: a container's StartedAt never changes and RestartCount stays 0. */
  private checkContainers(containers: readonly ChaosContainer[]): void {
    for (const c of containers) {
      const owner = this.tracked.get(c.taskId);
      if (owner) {
        this.sawContainer(owner, c.id, "Docker");
        if (c.startedAt !== "" && c.startedAt !== NEVER_STARTED) owner.ran = true;
      }
      if (c.restartCount !== 0)
        this.violation("restarted_containers", `${c.name}: RestartCount ${c.restartCount}`);
      if (c.startedAt === "" || c.startedAt === NEVER_STARTED) continue;
      const first = this.startedAt.get(c.id);
      if (first === undefined || this.externallyRestarted.has(c.id)) {
        this.startedAt.set(c.id, c.startedAt);
        this.externallyRestarted.delete(c.id);
      } else if (first !== c.startedAt) {
        this.startedAt.set(c.id, c.startedAt);
        this.violation("restarted_containers", `${c.name}: restarted (StartedAt ${first} → ${c.startedAt})`);
      }
    }
  }

  // ---------------------------------------------------------------- oracle

  /**
   * The §9.1 oracle, once the shim has served and ticked: waits (bounded) until every task
   * has settled, then checks I1, I2, I3 (set equalities), I5/I6 (via the tracker), and fails
   * the calling test with every violation found since the last oracle.
   */
  async oracle(options: { probeGpus?: boolean; settleMs?: number } = {}): Promise<void> {
    this.stats.scenarios += 1;
    const { infos, containers, states, unsettled } = await this.settle(options.settleMs ?? 10_000);
    for (const u of unsettled) this.violation("other", `not settled: ${u}`);
    const view = new Map(infos.map((i) => [i.id, i]));
    for (const info of infos) {
      const t = this.tracked.get(info.id);
      if (t) await this.checkStarts(t);
    }

    this.checkTasksAndContainers(view, containers, states);
    const live = infos.filter((i) => i.status !== "terminated");
    this.checkGpus(infos, containers);
    await this.checkKeys(view);
    await this.checkMounts(live);
    await this.checkDirs(view);
    if (options.probeGpus) await this.probeGpus(live);

    const found = this.violations.splice(0);
    expect(found, `${this.tag}: oracle violations`).toEqual([]);
  }

  private async settle(timeoutMs: number): Promise<{
    infos: TaskInfo[];
    containers: ChaosContainer[];
    states: Map<string, ChaosTaskState | undefined>;
    unsettled: string[];
  }> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const infos = await this.list();
      const containers = await this.containers();
      const states = new Map<string, ChaosTaskState | undefined>();
      const unsettled: string[] = [];
      for (const info of infos) {
        const state = this.tracked.has(info.id) ? await this.readState(info.id) : undefined;
        states.set(info.id, state);
        const c = containers.find((x) => x.taskId === info.id);
        if (PRE_CONTAINER.has(info.status)) unsettled.push(`${info.id} is still ${info.status}`);
        else if (
          info.status === "running" &&
          (!c || !["running", "paused", "restarting"].includes(c.state))
        ) {
          unsettled.push(`${info.id} is running but its container is ${c?.state ?? "missing"}`);
        } else if (info.status === "terminated") {
          if (c?.state === "running") unsettled.push(`${info.id} is terminated but its container runs`);
          if (state && state.cleaned_up !== true) unsettled.push(`${info.id} is terminated but not released`);
          if ((info.gpus_ids ?? []).length > 0) unsettled.push(`${info.id} is terminated but holds GPUs`);
        }
      }
      if (unsettled.length === 0 || Date.now() > deadline) return { infos, containers, states, unsettled };
      await sleep(100);
    }
  }

  /** I1 and I2. */
  private checkTasksAndContainers(
    view: ReadonlyMap<string, TaskInfo>,
    containers: readonly ChaosContainer[],
    states: ReadonlyMap<string, ChaosTaskState | undefined>,
  ): void {
    for (const t of this.tracked.values()) {
      if (t.answered && t.removed === "no" && !view.has(t.config.id)) {
        this.violation("lost", `${t.config.id}: answered but no longer listed`);
      }
    }
    const byTask = new Map<string, ChaosContainer[]>();
    for (const c of containers) byTask.set(c.taskId, [...(byTask.get(c.taskId) ?? []), c]);
    for (const [taskId, list] of byTask) {
      for (const c of list) {
        if (this.strays.has(c.name) && (taskId === "" || !view.has(taskId))) continue;
        if (taskId === "")
          this.violation("leaked_containers", `${c.name}: labelled container without task id`);
        else if (!view.has(taskId))
          this.violation("leaked_containers", `${c.name}: container of no task (${taskId})`);
      }
      if (taskId !== "" && list.length > 1) {
        this.violation("leaked_containers", `${taskId}: ${list.length} containers for one task`);
      }
    }
    for (const info of view.values()) {
      const t = this.tracked.get(info.id);
      const c = byTask.get(info.id)?.[0];
      if (
        info.status !== "terminated" &&
        info.container_id !== "" &&
        !containers.some((x) => x.id === info.container_id)
      ) {
        this.violation("lost", `${info.id}: ${info.status} but its container ${info.container_id} is gone`);
      }
      if (info.status === "running" && c && info.container_id !== c.id) {
        this.violation("other", `${info.id}: points at ${info.container_id}, labelled container is ${c.id}`);
      }
      if (info.status !== "terminated" || !t) continue;
      const reason = info.termination_reason;
      const state = states.get(info.id);
      // Against the books: the programmed fate and the faults the test caused.
      this.judgeReason(t, reason, info.termination_message);
      this.judgeExit(t, reason, c, state);
      const exitBased = reason === "done_by_runner" || reason === "container_exited_with_error";
      const exited = c !== undefined && (c.state === "exited" || c.state === "dead");
      // A remove is accepted only once the terminal state is durable; it may have removed the
      // container before a kill cut it.
      const vanishExplained = t.exitConfirmed || t.removeAttempted;
      if (exitBased) {
        if (!c) {
          if (!vanishExplained && reason === "done_by_runner") {
            this.violation(
              "wrong_exit",
              `${info.id}: its container vanished, yet it is reported done_by_runner`,
            );
          }
        } else if (!exited) {
          this.violation("wrong_exit", `${info.id}: ${reason} but its container is ${c.state}`);
        } else {
          const expected = c.exitCode === 0 ? "done_by_runner" : "container_exited_with_error";
          if (reason !== expected) {
            this.violation("wrong_exit", `${info.id}: exit code ${c.exitCode} reported as ${reason}`);
          }
          if (state && state.exit_code !== c.exitCode) {
            this.violation(
              "wrong_exit",
              `${info.id}: task.json exit_code ${state.exit_code} but container exited ${c.exitCode}`,
            );
          }
          if (reason === expected) t.exitConfirmed = true;
        }
      }
      if (!c && state?.exit_code === 0 && !vanishExplained) {
        this.violation("wrong_exit", `${info.id}: container vanished but task.json says exit code 0`);
      }
    }
  }

  /** I3 for GPUs from the shim's and Docker's views. */
  private checkGpus(infos: readonly TaskInfo[], containers: readonly ChaosContainer[]): void {
    const held = new Map<string, string>();
    for (const info of infos) {
      const ids = info.gpus_ids ?? [];
      if (info.status === "terminated") {
        if (ids.length > 0)
          this.violation("leaked_gpus", `${info.id}: terminated but holds ${ids.join(",")}`);
        continue;
      }
      for (const id of ids) {
        if (!(FIXTURE_GPUS as readonly string[]).includes(id))
          this.violation("leaked_gpus", `${info.id}: unknown GPU ${id}`);
        const other = held.get(id);
        if (other !== undefined)
          this.violation("leaked_gpus", `${id} granted to both ${other} and ${info.id}`);
        held.set(id, info.id);
      }
      const c = containers.find((x) => x.taskId === info.id);
      if (info.status === "running" && c) {
        const devices = [...c.gpuDevices].sort().join(",");
        if (devices !== [...ids].sort().join(",")) {
          this.violation(
            "leaked_gpus",
            `${info.id}: container has GPUs [${devices}], the shim says [${ids.join(",")}]`,
          );
        }
      }
    }
  }

  /** I3 for keys: marked entries = keys of non-released tasks, no duplicates, hand lines intact. */
  private async checkKeys(view: ReadonlyMap<string, TaskInfo>): Promise<void> {
    const { marked } = await this.checkKeysFile("oracle");
    const expected = new Set<string>();
    const optional = new Set<string>();
    for (const info of view.values()) {
      const t = this.tracked.get(info.id);
      for (const key of t?.config.host_ssh_keys ?? []) {
        if (info.status !== "terminated") expected.add(keyBlob(key));
        else if (t?.degraded) optional.add(keyBlob(key));
      }
    }
    const actual = new Set(marked);
    for (const blob of actual) {
      if (!expected.has(blob) && !optional.has(blob))
        this.violation("leaked_keys", `key ${blob.slice(-12)} of no live task`);
    }
    for (const blob of expected) {
      if (!actual.has(blob))
        this.violation("leaked_keys", `key ${blob.slice(-12)} of a live task is missing`);
    }
  }

  /** I3 for volumes: mounted = volumes of non-released tasks, each exactly once. */
  private async checkMounts(live: readonly TaskInfo[]): Promise<void> {
    const mounted = await this.mounts();
    const dups = mounted.length - new Set(mounted).size;
    if (dups > 0) this.violation("leaked_mounts", `${dups} stacked mount(s): ${mounted.join(" ")}`);
    const expected = new Set<string>();
    for (const info of live) {
      for (const v of this.tracked.get(info.id)?.config.volumes ?? []) {
        expected.add(join(this.mountRoot, String(v.name)));
      }
    }
    for (const point of new Set(mounted)) {
      if (!expected.has(point)) this.violation("leaked_mounts", `${point} mounted for no live task`);
    }
    for (const point of expected) {
      if (!mounted.includes(point)) this.violation("leaked_mounts", `${point} of a live task is not mounted`);
    }
  }

  /** I3 for task dirs: `<home>/runners` holds the dirs of listed tasks (and quarantined files). */
  private async checkDirs(view: ReadonlyMap<string, TaskInfo>): Promise<void> {
    const names = new Set([...view.values()].map((i) => i.container_name));
    const runners = join(this.home, "runners");
    for (const name of await readdir(runners).catch(() => [] as string[])) {
      if (names.has(name)) continue;
      const files = await readdir(join(runners, name)).catch(() => [] as string[]);
      if (!name.startsWith(".") && files.some((f) => f.startsWith("task.json.quarantined-"))) continue;
      this.violation("leaked_dirs", `${join("runners", name)} belongs to no task (${files.join(",")})`);
    }
  }

  /**
   * Probes the GPU lock: a `gpu: -1` task takes every free GPU; they must be exactly the GPUs
   * no live task holds.
   */
  private async probeGpus(live: readonly TaskInfo[]): Promise<void> {
    const held = new Set(live.flatMap((i) => i.gpus_ids ?? []));
    const expectedFree = FIXTURE_GPUS.filter((g) => !held.has(g));
    const probe = this.task({
      gpu: -1,
      command: ["sh", "-c", "ls /dev/dri 2>/dev/null; echo end; exit 1"],
      fate: { kind: "exits", code: 1, trigger: "self" },
    });
    await this.submit(probe);
    const done = await this.waitTerminated(probe.id);
    const free = done.termination_message
      .split("\n")
      .filter((l) => /^renderD\d+$/.test(l))
      .map((l) => `/dev/dri/${l}`)
      .sort();
    for (const g of free) {
      if (held.has(g)) this.violation("leaked_gpus", `probe was granted ${g}, which a live task holds`);
    }
    for (const g of expectedFree) {
      if (!free.includes(g)) this.violation("leaked_gpus", `${g} is held by no live task but is locked`);
    }
    expect((await this.remove(probe.id))?.status).toBe(200);
  }
}
