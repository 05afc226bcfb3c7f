/*
 * A task's own container, found by its recorded id or its name: only a container with this
 * task's id label that the ownership rule says is ours stands in for it.
 */
import type { ContainerState } from "../docker/docker-client.js";
import type { Task } from "../tasks/task.js";
import type { RunnerContext } from "./runner-context.js";
import { StartStepError } from "./start-errors.js";

/** A container of this task that already exists (by name, with our task label). */
export async function findOwnContainer(
  ctx: RunnerContext,
  task: Task,
): Promise<{ id: string; state: ContainerState; startedAt: string } | undefined> {
  const candidate = await ctx.docker.inspectContainer(task.containerId ?? task.containerName);
  if (!candidate) return undefined;
  if (candidate.taskId !== task.id) {
    throw new StartStepError(
      "creating_container_error",
      `createContainer error: a container named ${task.containerName} exists and belongs to another task`,
    );
  }
  // The same task id under another home (the one ownership rule): never adopted.
  if (!ctx.ownership.isOurs(candidate, hasTaskState(ctx))) {
    throw new StartStepError(
      "creating_container_error",
      `createContainer error: a container named ${task.containerName} exists and belongs to another taskshim home`,
    );
  }
  return { id: candidate.id, state: candidate.state, startedAt: candidate.startedAt };
}

/**
 * The id of this task's container found by name (a task that never recorded one), or "" when
 * there is none or it is not ours: a container of that name under another home is left alone.
 */
export async function ownContainerIdByName(ctx: RunnerContext, task: Task): Promise<string> {
  const candidate = await ctx.docker.inspectContainer(task.containerName);
  if (!candidate || candidate.taskId !== task.id) return "";
  return ctx.ownership.isOurs(candidate, hasTaskState(ctx)) ? candidate.id : "";
}

/**
 * Whether a task id has a state here, as the ownership rule asks about a container without an
 * owner label. Its callers ask only about the task in hand (the container's task id was checked
 * to be that task's), which is in the store.
 */
const hasTaskState =
  (ctx: RunnerContext) =>
  // Stryker disable next-line ConditionalExpression: both callers ask about the task they hold, which is in the store: the answer is always true
  (taskId: string): boolean =>
    ctx.store.get(taskId) !== undefined;
