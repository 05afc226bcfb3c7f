import { join } from "node:path";
import { FIXTURE_GPUS, keyBlob } from "./chaos-host.js";
import type { Category, ChaosStats } from "./chaos-stats.js";
import {
  newTrackedTask,
  type ChaosContainer,
  type ChaosTaskConfig,
  type ChaosTaskState,
  type Fate,
  type TrackedTask,
} from "./chaos-tracker.js";
import type { TaskInfo } from "./shim-process.js";

/*
 * The chaos oracle: the invariants I1–I8 of docs/fault-matrix.md as checks over what a scenario
 * saw (the shim's answers, Docker's containers, task.json files, authorized_keys, mounts, task
 * dirs), judged against the tracker's books (chaos-tracker.ts). It does no I/O itself: the
 * scenario (chaos-scenario.ts) reads the host and hands it the views. Each violation is counted
 * in the suite's ChaosStats under its summary column and kept until the scenario's next oracle
 * run reports it.
 */

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

/** The order of the statuses: a task only moves up (I5). */
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

/** The shim's own termination reasons that say the workload exited by itself. */
const EXIT_BASED: ReadonlySet<string> = new Set(["done_by_runner", "container_exited_with_error"]);
/** The shim's own reasons for a task whose start failed before a container ran. */
const START_FAILURES: ReadonlySet<string> = new Set(["creating_container_error", "executor_error"]);
const CONTAINER_NOT_FOUND = "container not found";
/** What a container killed by the test's simulated reboot exits with (SIGKILL). */
const REBOOT_EXIT_CODE = 137;
/** How the shim must begin the message of a task whose container a reboot ended. */
const REBOOT_NOTE = `the host rebooted while the task was running (exit code ${REBOOT_EXIT_CODE})`;

/** The user's authorized_keys as the scenario read it. */
export interface KeysFileView {
  /** The marked key blobs, in file order. */
  readonly marked: readonly string[];
  /** The lines the shim did not mark. */
  readonly unmarked: readonly string[];
  readonly size: number;
  readonly mode: number;
  readonly uid: number;
  readonly gid: number;
}

/** What the scenario's host looked like before the shim touched it. */
export interface HostExpectations {
  /** The hand-written lines of the user's authorized_keys: kept byte for byte. */
  readonly handWrittenKeys: readonly string[];
  /** The owner (uid and gid) of the user's authorized_keys. */
  readonly keysOwner: number;
}

/**
 * Why a listed task has not settled yet (empty: it has), from its answer, its labelled
 * container and its task.json: I4's bounded settle waits until no task has a reason left.
 */
export function unsettledReasons(
  info: TaskInfo,
  c: ChaosContainer | undefined,
  state: ChaosTaskState | undefined,
): string[] {
  const unsettled: string[] = [];
  if (PRE_CONTAINER.has(info.status)) unsettled.push(`${info.id} is still ${info.status}`);
  else if (info.status === "running" && (!c || !["running", "paused", "restarting"].includes(c.state))) {
    unsettled.push(`${info.id} is running but its container is ${c?.state ?? "missing"}`);
  } else if (info.status === "terminated") {
    if (c?.state === "running") unsettled.push(`${info.id} is terminated but its container runs`);
    if (state && state.cleaned_up !== true) unsettled.push(`${info.id} is terminated but not released`);
    if ((info.gpus_ids ?? []).length > 0) unsettled.push(`${info.id} is terminated but holds GPUs`);
  }
  return unsettled;
}

/** The books of one scenario and the invariant checks over them. */
export class ChaosOracle {
  readonly tracked = new Map<string, TrackedTask>();
  /** Container names of labelled containers made by hand (W3): not leaks. */
  readonly strays = new Set<string>();
  /** Containers the test itself restarted (W2). */
  readonly externallyRestarted = new Set<string>();
  /** Violations found since the last {@link takeViolations}. */
  readonly violations: string[] = [];
  private readonly startedAt = new Map<string, string>();

  constructor(
    private readonly stats: ChaosStats,
    private readonly host: HostExpectations,
  ) {}

  /** Records a violation: counted for the summary, reported by the next oracle. */
  violation(category: Category, message: string): void {
    this.stats.counts[category] += 1;
    this.violations.push(`[${category}] ${message}`);
  }

  /** The violations found since the last call, forgotten. */
  takeViolations(): string[] {
    return this.violations.splice(0);
  }

  /** Starts the books of a task (before it is sent, so an unanswered submit is known). */
  track(config: ChaosTaskConfig, containerName: string, fate: Fate): TrackedTask {
    const existing = this.tracked.get(config.id);
    if (existing) return existing;
    const t = newTrackedTask(config, containerName, fate);
    this.tracked.set(config.id, t);
    this.stats.tasks += 1;
    return t;
  }

  /** I1 from the very first answers after a restart: every answered task is still listed. */
  checkListedAfterRestart(infos: readonly TaskInfo[]): void {
    const seen = new Set(infos.map((i) => i.id));
    for (const t of this.tracked.values()) {
      if (t.answered && t.removed === "no" && !seen.has(t.config.id)) {
        this.violation("lost", `${t.config.id}: answered with 200 but missing after the restart`);
      }
    }
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
   * must be one a terminate asked for. A container the test's reboot killed must end
   * `container_exited_with_error`, the message saying the host rebooted.
   */
  private judgeReason(t: TrackedTask, reason: string, message: string): void {
    if (!VALID_REASONS.has(reason)) {
      this.flag(t, "reason", "wrong_exit", `invalid reason ${JSON.stringify(reason)}`);
      return;
    }
    const fate = t.fate;
    if (EXIT_BASED.has(reason) && t.killedByReboot) {
      // The reboot's SIGKILL decided the exit, not the workload's programme.
      if (reason !== "container_exited_with_error") {
        this.flag(
          t,
          "reason",
          "wrong_exit",
          `reported ${reason}, but the test's reboot killed its container`,
        );
      } else if (!message.startsWith(REBOOT_NOTE)) {
        this.flag(t, "reason", "wrong_exit", `killed by the test's reboot, but the message does not say so`);
      }
    } else if (EXIT_BASED.has(reason)) {
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
   * there) and task.json's must both be the programmed one (137 for an OOM kill or the reboot's kill).
   */
  judgeExit(
    t: TrackedTask,
    reason: string,
    container: ChaosContainer | undefined,
    state: ChaosTaskState | undefined,
  ): void {
    if (!EXIT_BASED.has(reason)) return;
    let programmed: number;
    if (t.killedByReboot) programmed = REBOOT_EXIT_CODE;
    else if (t.fate.kind === "exits") programmed = t.fate.code;
    else return;
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
    if (
      exited &&
      !t.killedByReboot &&
      t.fate.kind === "exits" &&
      t.fate.oom === true &&
      !container.oomKilled
    ) {
      this.flag(t, "exit", "wrong_exit", "programmed to be OOM-killed, but its container was not");
    }
  }

  /**
   * How often the workload started, from its own record in the task dir (`starts`, one
   * `started` line per start): more than once (plus the restarts the test caused) is a
   * restarted or replaced container, even one never seen.
   */
  judgeStarts(t: TrackedTask, record: string): void {
    const starts = record.split("\n").filter((l) => l === "started").length;
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
  checkContainers(containers: readonly ChaosContainer[]): void {
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

  /** I1 and I2. */
  checkTasksAndContainers(
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
  checkGpus(infos: readonly TaskInfo[], containers: readonly ChaosContainer[]): void {
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

  /**
   * The I3 checks on authorized_keys that need no shim: the file is never empty, the
   * hand-written lines are intact, mode and owner unchanged, no marked line twice.
   */
  checkKeysFile(context: string, file: KeysFileView): void {
    if (file.size === 0) this.violation("leaked_keys", `${context}: authorized_keys is empty`);
    if (JSON.stringify(file.unmarked) !== JSON.stringify(this.host.handWrittenKeys)) {
      this.violation(
        "leaked_keys",
        `${context}: hand-written lines changed: ${JSON.stringify(file.unmarked)}`,
      );
    }
    const owner = this.host.keysOwner;
    if (file.mode !== 0o600 || file.uid !== owner || file.gid !== owner) {
      this.violation(
        "other",
        `${context}: authorized_keys mode/owner changed: ${file.mode.toString(8)} ${file.uid}:${file.gid}`,
      );
    }
    const dups = file.marked.length - new Set(file.marked).size;
    if (dups > 0) this.violation("leaked_keys", `${context}: ${dups} duplicated marked key line(s)`);
  }

  /** I3 for keys: marked entries = keys of non-released tasks (a degraded task's may stay). */
  checkKeys(view: ReadonlyMap<string, TaskInfo>, marked: readonly string[]): void {
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

  /** I3 for volumes: `mounted` (under `mountRoot`) = volumes of non-released tasks, each once. */
  checkMounts(live: readonly TaskInfo[], mounted: readonly string[], mountRoot: string): void {
    const dups = mounted.length - new Set(mounted).size;
    if (dups > 0) this.violation("leaked_mounts", `${dups} stacked mount(s): ${mounted.join(" ")}`);
    const expected = new Set<string>();
    for (const info of live) {
      for (const v of this.tracked.get(info.id)?.config.volumes ?? []) {
        expected.add(join(mountRoot, String(v.name)));
      }
    }
    for (const point of new Set(mounted)) {
      if (!expected.has(point)) this.violation("leaked_mounts", `${point} mounted for no live task`);
    }
    for (const point of expected) {
      if (!mounted.includes(point)) this.violation("leaked_mounts", `${point} of a live task is not mounted`);
    }
  }

  /**
   * I3 for task dirs: `<home>/runners` (each dir name with its files) holds the dirs of listed
   * tasks, and dirs whose task.json was quarantined (moved to `<home>/quarantine/`, named in
   * `quarantined`; releases up to 1.0.0 renamed it in place).
   */
  checkDirs(
    view: ReadonlyMap<string, TaskInfo>,
    runners: ReadonlyMap<string, readonly string[]>,
    quarantined: ReadonlySet<string>,
  ): void {
    const names = new Set([...view.values()].map((i) => i.container_name));
    for (const [name, files] of runners) {
      if (names.has(name)) continue;
      if (!name.startsWith(".") && !files.includes("task.json") && quarantined.has(name)) continue;
      if (!name.startsWith(".") && files.some((f) => f.startsWith("task.json.quarantined-"))) continue;
      this.violation("leaked_dirs", `${join("runners", name)} belongs to no task (${files.join(",")})`);
    }
  }

  /**
   * I3 for the GPU lock, from a probe task that took every free GPU: `free` (what it got) must
   * be exactly the GPUs no live task holds.
   */
  checkGpuProbe(live: readonly TaskInfo[], free: readonly string[]): void {
    const held = new Set(live.flatMap((i) => i.gpus_ids ?? []));
    const expectedFree = FIXTURE_GPUS.filter((g) => !held.has(g));
    for (const g of free) {
      if (held.has(g)) this.violation("leaked_gpus", `probe was granted ${g}, which a live task holds`);
    }
    for (const g of expectedFree) {
      if (!free.includes(g)) this.violation("leaked_gpus", `${g} is held by no live task but is locked`);
    }
  }
}
