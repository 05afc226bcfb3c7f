import { existsSync } from "node:fs";
import { posix } from "node:path";
import type { ContainerDetails, TaskContainerSummary } from "../docker/docker-client.js";
import { decodeStoredConfig } from "../state/stored-config.js";
import { isValidTaskName, isValidVolumeName, type TaskConfig } from "../tasks/task-config.js";
import type { RunnerContext } from "./runner-context.js";

/*
 * A task restored from its container alone: one created by a shim that wrote no task.json, or
 * one adopted under --adopt-unowned. Only what the container itself tells is known.
 */

/**
 * A container created by a shim without task.json: only what the container itself tells. Read
 * as a stored config (the reader that restores every task.json, with the same zero values), not
 * through the submit validator, whose policy may refuse a label or a mount name: its task.json,
 * once written, reads back with the same id.
 */
export function legacyConfig(
  taskId: string,
  container: TaskContainerSummary,
  volumes: readonly { readonly name: string; readonly path: string }[],
): TaskConfig {
  // A mount whose name the submit would refuse is not taken for a volume this task may release.
  const named = volumes.filter((v) => isValidVolumeName(v.name));
  // A name its task.json could not be read back with (a very long container name) is not kept.
  const stem = container.name.replace(/-[0-9a-f]{8}$/, "");
  return decodeStoredConfig({
    id: taskId,
    name: isValidTaskName(stem) ? stem : "task",
    image_name: "unknown",
    volumes: named.map((v) => ({ name: v.name })),
    volume_mounts: named.map((v) => ({ name: v.name, path: v.path })),
  });
}

/**
 * The network volumes a container uses, from its mounts: every mount whose host source is a
 * direct child of the volume mount root (where a shim mounts volumes) names one volume.
 */
export function recoveredVolumes(
  ctx: RunnerContext,
  inspect: ContainerDetails | undefined,
): { name: string; path: string }[] {
  const root = posix.normalize(ctx.params.volumeMountRoot);
  const found: { name: string; path: string }[] = [];
  for (const mount of inspect?.mounts ?? []) {
    const source = posix.normalize(mount.source);
    if (posix.dirname(source) !== root) continue;
    const name = posix.basename(source);
    if (name === "" || name.startsWith(".") || found.some((v) => v.name === name)) continue;
    found.push({ name, path: mount.destination });
  }
  return found;
}

/**
 * The dir an earlier shim kept for this container, by its name, when one is there: else "" (a
 * name no dir can have counts as none).
 */
export function legacyDir(ctx: RunnerContext, containerName: string): string {
  try {
    const dir = ctx.dirs.dirFor(containerName);
    return existsSync(dir) ? dir : "";
  } catch {
    return "";
  }
}
