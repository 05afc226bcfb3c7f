import { after, type ChildWatch } from "./child-watch.js";

/*
 * What a bounded run killed: the kill-and-reap of a command's process group, and the evidence it
 * leaves of what happened. The runner (run-bounded.ts) calls it when the bound fires, the operator
 * interrupts or the child cannot be waited for.
 */

/** Why a command's process group had to be killed. */
export type CleanupTrigger = "deadline" | "interruption" | "wait_failure";

/**
 * A plain, serialisable record of what happened when a command was killed and reaped, as written
 * to logs, error records and `taskshim fence --json` (hence the snake_case).
 */
export interface CleanupEvidence {
  readonly trigger: CleanupTrigger;
  /** How long the cleanup took, in whole milliseconds. */
  readonly elapsed_ms: number;
  /** The grace the group's leader had to be reaped. */
  readonly reap_grace_ms: number;
  /** The grace the pipes had to finish once the group was killed. */
  readonly io_drain_grace_ms: number;
  readonly kill_attempted: boolean;
  /** True when the group was signalled, its leader reaped and every pipe finished in time. */
  readonly verified: boolean;
  /** The step that failed; null when verified. */
  readonly error: string | null;
}

/**
 * The result of a kill-and-reap. `ok` means all of it: the group was signalled, its leader reaped
 * within the reap grace, and every pipe finished within the drain grace.
 */
export type KillResult = { readonly ok: true } | { readonly ok: false; readonly error: string };

/** The graces of a kill-and-reap. */
export interface CleanupGraces {
  /** For the killed group's leader to be reaped. */
  readonly reapMs: number;
  /** For the pipes to finish once the group is killed. */
  readonly drainMs: number;
}

/**
 * SIGKILLs the group, waits for its leader to be reaped, then for every pipe to finish. The
 * kill is `ok` only when all three happened; a stdin write that failed because the group died
 * still counts as finished (its result belongs to the operation, not to the cleanup).
 */
export async function killAndReap(
  watch: ChildWatch,
  graces: CleanupGraces,
  trigger: CleanupTrigger,
): Promise<{ kill: KillResult; cleanup: CleanupEvidence }> {
  const started = performance.now();
  const error = await terminate(watch, graces);
  const kill: KillResult = error === null ? { ok: true } : { ok: false, error };
  return {
    kill,
    cleanup: {
      trigger,
      elapsed_ms: Math.round(performance.now() - started),
      reap_grace_ms: graces.reapMs,
      io_drain_grace_ms: graces.drainMs,
      kill_attempted: true,
      verified: kill.ok,
      error,
    },
  };
}

/** The cleanup's steps; null when all of them succeeded, else what failed. */
async function terminate(watch: ChildWatch, graces: CleanupGraces): Promise<string | null> {
  const signalled = signalGroup(watch);
  if (signalled !== null) {
    watch.abandonPipes();
    return signalled;
  }
  const reap = after(graces.reapMs);
  const reaped = await Promise.race([watch.exited.then(() => "reaped" as const), reap.promise]);
  reap.cancel();
  if (reaped !== "reaped") {
    watch.abandonPipes();
    return `command child did not reap within ${graces.reapMs} ms`;
  }
  const drain = after(graces.drainMs);
  const drained = await Promise.race([watch.ioFinished(), drain.promise]);
  drain.cancel();
  if (drained !== "io-finished") {
    watch.abandonPipes();
    return `command I/O did not drain within ${graces.drainMs} ms after termination`;
  }
  return null;
}

/**
 * SIGKILLs the child's process group; if that fails while the child still runs, the child alone.
 * Returns null once a signal was delivered (or nothing was left to signal), else the error.
 */
function signalGroup(watch: ChildWatch): string | null {
  const pid = watch.child.pid;
  if (pid === undefined) return "child process has no pid";
  try {
    // A negative pid addresses the whole process group the child leads (spawned detached).
    process.kill(-pid, "SIGKILL");
    return null;
  } catch (groupError) {
    // ESRCH with the leader reaped: the group is gone, which is what we wanted.
    if (watch.reaped) return null;
    if (watch.child.kill("SIGKILL")) return null;
    return `cannot signal process group ${pid} (${String(groupError)}) nor the child`;
  }
}
