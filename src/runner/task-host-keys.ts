/*
 * The host keys the tasks claim: each user's shim entries in authorized_keys are the union of
 * the live tasks' keys, reconciled as a whole (never appended to or removed from one by one).
 */
import { UserKeysReconcileError } from "../host/authorized-keys.js";
import type { TaskStore } from "../tasks/task-store.js";
import type { RunnerContext } from "./runner-context.js";

/**
 * Makes every user's shim entries in authorized_keys the union of the live tasks' keys.
 * While a task whose keys are unknown (degraded) is alive, entries are only added.
 */
export function reconcileHostKeys(ctx: RunnerContext, extraUsers: readonly string[] = []): Promise<void> {
  const keepExisting = ctx.store
    .list()
    .some((t) => (t.degraded === true || t.held !== undefined) && !t.cleanedUp && t.status !== "terminated");
  return ctx.hostKeys.reconcile(() => hostKeysByUser(ctx.store, extraUsers), { keepExisting });
}

/** The host keys every live task needs, per user (a terminated task needs none). */
export function hostKeysByUser(store: TaskStore, extraUsers: readonly string[] = []): Map<string, string[]> {
  const byUser = new Map<string, string[]>(extraUsers.map((u) => [u, []]));
  for (const task of store.list()) {
    const live = !task.cleanedUp && task.status !== "terminated";
    if (!live || task.config.host_ssh_user === "" || task.config.host_ssh_keys.length === 0) continue;
    const keys = byUser.get(task.config.host_ssh_user) ?? [];
    keys.push(...task.config.host_ssh_keys);
    byUser.set(task.config.host_ssh_user, keys);
  }
  return byUser;
}

/**
 * The error that concerns `user` in a host keys reconcile failure: its own per-user error,
 * or the whole error when it is not a per-user one; undefined when only other users failed.
 */
export function failureOfUser(error: unknown, user: string): Error | undefined {
  if (!(error instanceof AggregateError)) return error as Error;
  const perUser = error.errors.filter(
    (e): e is UserKeysReconcileError => e instanceof UserKeysReconcileError,
  );
  if (perUser.length !== error.errors.length) return error;
  return perUser.find((e) => e.user === user);
}
