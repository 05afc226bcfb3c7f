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
import { ChaosOracle, unsettledReasons } from "./chaos-oracle.js";
import type { Category, ChaosStats } from "./chaos-stats.js";
import type { ChaosContainer, ChaosTaskConfig, ChaosTaskState, Fate, TrackedTask } from "./chaos-tracker.js";
import { testDocker } from "./docker.js";
import { ShimProcess, type Answer, type TaskInfo } from "./shim-process.js";

const execFileAsync = promisify(execFile);

/*
 * One chaos scenario: a shim home with its own host user (authorized_keys with hand-written
 * lines), its own volume mount root, its own view of the engine (chaos-docker-proxy.ts), the
 * shim process and its HTTP API, and a tracker that hands every answer the shim gives and every
 * container sighting to the oracle (chaos-oracle.ts: the invariants I1–I8 of
 * docs/fault-matrix.md).
 *
 * The tracker keeps its own books (chaos-tracker.ts) and trusts nothing the shim says: what
 * each task's workload was programmed to do (its {@link Fate}), every fault the test itself
 * caused (a terminate with its reason, a remove, a container removed, restarted or started from
 * outside), every container id seen for the task (API and Docker) and how often the workload
 * really started (it appends a line to `/tmp/runner/starts` each time). Each terminal status is
 * judged against those books, never against another answer of the shim.
 */

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
  /** The scenario's own kernel boot id file: {@link reboot} changes it for this scenario alone. */
  readonly bootIdFile: string;
  readonly user = "cxuser";
  /** The books and the invariant checks (docs/fault-matrix.md I1–I8). */
  readonly books: ChaosOracle;
  shim: ShimProcess | undefined;
  /** The fate of every task built by {@link task}, by id. */
  private readonly fates = new Map<string, Fate>();
  private readonly processes: ShimProcess[] = [];
  private proxy: DockerProxy | undefined;
  private seq = 0;
  private boots = 0;

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
    this.bootIdFile = join(this.dir, "boot_id");
    this.books = new ChaosOracle(stats, { handWrittenKeys: HAND_WRITTEN, keysOwner: HOST_UID });
  }

  /** The tracker's books, by task id. */
  get tracked(): Map<string, TrackedTask> {
    return this.books.tracked;
  }

  /** Container names of labelled containers made by hand (W3): not leaks. */
  get strays(): Set<string> {
    return this.books.strays;
  }

  /** Violations found since the last oracle run (each already counted in the stats). */
  get violations(): string[] {
    return this.books.violations;
  }

  /** A scenario dir with its user (passwd entry, ~/.ssh/authorized_keys with hand-written lines). */
  static async create(host: ChaosHost, stats: ChaosStats, tag: string, image: string): Promise<Scenario> {
    const s = new Scenario(host, stats, tag, image);
    await mkdir(join(s.userHome, ".ssh"), { recursive: true, mode: 0o700 });
    await mkdir(s.mountRoot, { recursive: true });
    await writeFile(s.bootIdFile, `cx-boot-${host.nonce}-${tag}-0\n`);
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
        TASKSHIM_BOOT_ID_FILE: this.bootIdFile,
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
    this.books.checkListedAfterRestart(await this.list());
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
    const fate = this.fates.get(config.id) ?? { kind: "runs-until-told" };
    return this.books.track(config, containerNameFor(config.name, config.id), fate);
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
    this.books.externallyRestarted.add(containerId);
    await testDocker().getContainer(containerId).restart({ t: 0 });
  }

  /**
   * `docker start` of a `created` container from outside, standing in for a killed shim's late
   * start request: the one start the container may have, so it is not counted as a restart.
   */
  async startContainer(containerId: string): Promise<void> {
    await testDocker().getContainer(containerId).start();
  }

  /**
   * A host reboot while the shim is down (D7), recorded first: every running container of the
   * scenario is killed (SIGKILL, exit 137, as a power cut or the engine's own stop leaves it),
   * every mount under the scenario's mount root is gone, and the boot id changes.
   */
  async reboot(): Promise<void> {
    if (this.alive()) throw new Error(`${this.tag}: a reboot needs the shim down first`);
    for (const c of await this.containers()) {
      if (c.state !== "running") continue;
      const t = this.tracked.get(c.taskId);
      if (t) t.killedByReboot = true;
      await testDocker().getContainer(c.id).kill({ signal: "SIGKILL" });
    }
    for (const point of (await this.mounts()).reverse()) await execFileAsync("umount", ["-l", point]);
    this.boots += 1;
    await writeFile(this.bootIdFile, `cx-boot-${this.host.nonce}-${this.tag}-${this.boots}\n`);
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
    if (t.terminal && state) this.books.judgeExit(t, t.terminal.reason, undefined, state);
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
        // Podman's `stopped` is a container whose process exited and whose exit code is read,
        // its cleanup (conmon's `podman container cleanup`) not done yet: Docker's `exited`, as
        // the shim reads it (src/docker/podman-compat.ts). Under load the oracle saw it there.
        state: info.State.Status === "stopped" ? "exited" : info.State.Status,
        exitCode: info.State.ExitCode,
        oomKilled: info.State.OOMKilled,
        startedAt: info.State.StartedAt,
        restartCount: info.RestartCount,
        gpuDevices: ((info.HostConfig.Devices ?? []) as { PathInContainer?: string }[])
          .map((d) => d.PathInContainer ?? "")
          .filter((p) => p.startsWith("/dev/dri/render")),
      });
    }
    this.books.checkContainers(result);
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
    const st = await stat(this.keysFile);
    this.books.checkKeysFile(context, {
      marked,
      unmarked,
      size: raw.length,
      mode: st.mode & 0o777,
      uid: st.uid,
      gid: st.gid,
    });
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
    this.books.violation(category, message);
  }

  /** Hands one answer to the books (statuses never go back, terminal states never change). */
  observe(info: TaskInfo): void {
    this.books.observe(info);
  }

  /** How often the workload started, from its own record in the task dir (judged by the books). */
  private async checkStarts(t: TrackedTask): Promise<void> {
    let text: string;
    try {
      text = await readFile(join(this.home, "runners", t.containerName, "runner", STARTS_FILE), "utf8");
    } catch {
      return;
    }
    this.books.judgeStarts(t, text);
  }

  // ---------------------------------------------------------------- oracle

  /**
   * The oracle, once the shim has served and ticked: waits (bounded) until every task has
   * settled (I4), then checks I1, I2, I3 (set equalities), I5/I6 (via the tracker) of
   * docs/fault-matrix.md, and fails the calling test with every violation found since the last
   * oracle.
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

    this.books.checkTasksAndContainers(view, containers, states);
    const live = infos.filter((i) => i.status !== "terminated");
    this.books.checkGpus(infos, containers);
    const { marked } = await this.checkKeysFile("oracle");
    this.books.checkKeys(view, marked);
    this.books.checkMounts(live, await this.mounts(), this.mountRoot);
    this.books.checkDirs(view, await this.runnerDirs(), await this.quarantinedDirs());
    if (options.probeGpus) await this.probeGpus(live);

    const found = this.books.takeViolations();
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
        unsettled.push(...unsettledReasons(info, c, state));
      }
      if (unsettled.length === 0 || Date.now() > deadline) return { infos, containers, states, unsettled };
      await sleep(100);
    }
  }

  /** Each dir under `<home>/runners` with the names of its files. */
  /** The task dir names whose task.json lies in `<home>/quarantine/` (`<dir>.<ms>.task.json`). */
  private async quarantinedDirs(): Promise<Set<string>> {
    const names = await readdir(join(this.home, "quarantine")).catch(() => [] as string[]);
    return new Set(names.map((n) => /^(.+)\.\d+\.task\.json$/.exec(n)?.[1]).filter((n) => n !== undefined));
  }

  private async runnerDirs(): Promise<Map<string, string[]>> {
    const runners = join(this.home, "runners");
    const dirs = new Map<string, string[]>();
    for (const name of await readdir(runners).catch(() => [] as string[])) {
      dirs.set(name, await readdir(join(runners, name)).catch(() => [] as string[]));
    }
    return dirs;
  }

  /**
   * Probes the GPU lock: a `gpu: -1` task takes every free GPU; they must be exactly the GPUs
   * no live task holds.
   */
  private async probeGpus(live: readonly TaskInfo[]): Promise<void> {
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
    this.books.checkGpuProbe(live, free);
    expect((await this.remove(probe.id))?.status).toBe(200);
  }
}
