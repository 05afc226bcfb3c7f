/*
 * The counters behind the chaos summary line, shared by every scenario of a suite file (the
 * chaos suite and the storage faults). What each counter means is defined by the invariants
 * of docs/fault-matrix.md; the oracle (chaos-oracle.ts) decides which counter a violation
 * goes to.
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
