import pLimit from "p-limit";
import type { Reconciler } from "./reconciler.js";
import { restoreTasks, type RestoreReads, type RestoreReport } from "./restore.js";
import type { RunnerContext } from "./runner-context.js";
import type { TaskRunner } from "./task-runner.js";

/** Task.json writes of the restore's reconciled tasks in flight at once. */
export const RESTORED_WRITES_AT_ONCE = 16;

/** The parts a recovery works on: the context the tasks are restored into and what acts on them. */
export interface RecoveryParts {
  readonly ctx: RunnerContext;
  readonly runner: TaskRunner;
  readonly reconciler: Reconciler;
}

/** What a recovery found, and its last step, which waits until the API serves. */
export interface Recovery {
  readonly report: RestoreReport;
  /**
   * Resumes in the background the starts a restart cut (the report's `resumed` tasks). Called
   * once the API serves, never before: a start resumed earlier would still write into the home
   * after a failed listen had released its lock.
   */
  resumeStarts(): void;
}

/**
 * Recovers the tasks at startup, before the API serves, in this order:
 *
 * 1. **Restore** (`restoreTasks`): the store rebuilt from task.json and the engine's list. Its
 *    failure fails the start (it throws): nothing half-restored is served.
 * 2. **Persist what the restore reconciled** (the report's `changed`, up to
 *    {@link RESTORED_WRITES_AT_ONCE} at a time: each is its own file, and fsyncs in flight together
 *    can share the journal's commits), or a
 *    container that vanishes before the next change would send a task back to `creating`. A
 *    failed write is not an error here: the task stays *not yet durable* and is written once
 *    the home takes writes (a degraded home does not stop the start).
 * 3. **The first reconcile tick**, over the restore's own list (a second list would cost a round
 *    trip for nothing): exits that happened while the shim was down are final before the first
 *    request. Its failure fails the start.
 * 4. **Reconcile the host keys**, after the tick: tasks that ended while the shim was down no
 *    longer claim their keys. Its failure is logged ("host keys reconcile at startup failed")
 *    and the start goes on.
 * 5. **Resume the cut starts**: returned as {@link Recovery.resumeStarts}, for the caller to run
 *    once the API serves.
 */
export async function recover(
  { ctx, runner, reconciler }: RecoveryParts,
  begun?: RestoreReads,
): Promise<Recovery> {
  const report = await restoreTasks(ctx, begun);
  // (On a degraded home they stay not yet durable and are written once it takes writes.)
  await pLimit(RESTORED_WRITES_AT_ONCE).map(report.changed, (id) => runner.writeRestored(id));
  await reconciler.tick(report.listed);
  await runner.reconcileHostKeys().catch((error: unknown) => {
    ctx.log.error({ err: error }, "host keys reconcile at startup failed");
  });
  return {
    report,
    resumeStarts: () => {
      for (const id of report.resumed) runner.startInBackground(id);
    },
  };
}
