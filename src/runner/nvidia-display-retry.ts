/*
 * NVIDIA on headless hosts. The device request asks for every driver capability dstack-shim asks
 * for, `display` included, and nvidia-container-cli then mounts `/dev/nvidia-modeset`: on a host
 * whose driver has no modeset node (a headless compute install) the container fails before its
 * command runs (`stat failed: /dev/nvidia-modeset: no such file or directory`), and so did every
 * NVIDIA task there. As dstack-shim does (`shouldRetryWithoutNvidiaDisplayCapability` in
 * runner/internal/shim/docker.go), such a failure is retried once without `display`.
 */
import { errorMessage } from "../errors/error-message.js";
import type { Task } from "../tasks/task.js";
import type { RunnerContext } from "./runner-context.js";

/** The device node whose absence the engine's error names; dstack-shim matches the same text. */
export const NVIDIA_MODESET_PATH = "/dev/nvidia-modeset";

/**
 * Whether a failed create or start of `task`'s container is the one a container without NVIDIA's
 * `display` capability avoids: an NVIDIA host, the vendor's own device request (not explicit
 * `gpu_devices`), and an engine error that names {@link NVIDIA_MODESET_PATH}.
 */
export function needsDisplayRetry(ctx: RunnerContext, task: Task, cause: unknown): boolean {
  return (
    ctx.inventory.vendor === "nvidia" &&
    task.gpuIds.length > 0 &&
    task.config.gpu_devices.length === 0 &&
    errorMessage(cause).includes(NVIDIA_MODESET_PATH)
  );
}

/** The runs (one runner context each) that have said so already. */
const told = new WeakSet<RunnerContext>();

/**
 * Logs a retry without `display`: the first of a shim run at `warn` (the host lacks the node, and
 * the operator may want to know why graphics are off), every later one at `debug` only, since it
 * is then the expected course of every NVIDIA task on this host.
 */
export function noteDisplayRetry(ctx: RunnerContext, task: Task, cause: unknown): void {
  const fields = { taskId: task.id, error: errorMessage(cause) };
  if (told.has(ctx)) {
    ctx.log.debug(fields, "retrying the container without NVIDIA's display capability");
    return;
  }
  told.add(ctx);
  ctx.log.warn(
    fields,
    `this host has no ${NVIDIA_MODESET_PATH}: NVIDIA containers are made without the display capability (said once per run)`,
  );
}

/** A container could not be made again without `display`; `cause` says why. */
export class DisplayRetryError extends Error {
  override readonly name = "DisplayRetryError";
}
