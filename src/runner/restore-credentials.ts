import pLimit from "p-limit";
import type { ScannedTaskDir } from "../state/task-dirs.js";
import { deleteRegistryAuth, REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import { PRE_CONTAINER } from "./restored-task.js";
import type { RunnerContext } from "./runner-context.js";

/** Deletes in flight at once, as many as the restore's inspects: 200 dirs are not swept one round trip at a time. */
const SWEEP_CONCURRENCY = 16;

/**
 * Registry credentials are kept only for a pull still to come: they are deleted from every
 * restored task past `creating` (a start, or a release, that could not delete them — a full
 * disk, a kill) and from every dir without a valid task.json (a submit cut or failed before
 * it). A held dir (a newer release's, or evidence) and a dir the shim does not enter are left
 * alone.
 */
export async function sweepCredentials(
  ctx: RunnerContext,
  scanned: readonly ScannedTaskDir[],
): Promise<void> {
  const dirs = new Set<string>();
  for (const entry of scanned) {
    if (entry.kind !== "state" && entry.kind !== "unsafe" && ctx.dirs.heldBy(entry.dir) === undefined)
      dirs.add(entry.dir);
  }
  for (const task of ctx.store.list()) {
    // Stryker disable next-line StringLiteral: a "" dir added is a no-op (deleteRegistryAuth returns at once for "").
    if (task.taskDir !== "" && task.held === undefined && !PRE_CONTAINER.includes(task.status))
      dirs.add(task.taskDir);
  }
  // The scan listed most of these dirs: only those that held the file are asked to delete it.
  const listed = new Map(scanned.map((entry) => [entry.dir, entry.names]));
  // Stryker disable next-line BooleanLiteral: a scanned dir lacks names only if it could not be listed (an I/O fault), and its unlink fails alike.
  const mayHold = (dir: string): boolean => listed.get(dir)?.includes(REGISTRY_AUTH_FILE) ?? true;
  // Stryker disable next-line MethodExpression: without the filter every dir is asked, and an absent file is ignored: the same result, 200 calls later.
  await pLimit(SWEEP_CONCURRENCY).map([...dirs].filter(mayHold), (dir) => deleteRegistryAuth(dir));
}
