import { unlink } from "node:fs/promises";
import { join } from "node:path";
import { readBoundedFile } from "../state/bounded-read.js";
import { writeFileDurably } from "../state/durable-write.js";
import type { RegistryAuth } from "../tasks/task-config.js";

/**
 * Registry credentials live only here, never in task.json or logs: a 0600 file in the private
 * task dir, kept so a pull cut by a restart can resume, and deleted as soon as the pull ends or
 * the task is released.
 */
export const REGISTRY_AUTH_FILE = "registry-auth.json";

/**
 * The most of it that is read: what a submit body of at most 1 MiB can carry, with every
 * character escaped by JSON.stringify (6 bytes for a control character).
 */
const REGISTRY_AUTH_MAX_BYTES = 8 * 1024 * 1024;

/** Writes the credentials durably (0600). */
export async function writeRegistryAuth(taskDir: string, auth: RegistryAuth): Promise<void> {
  await writeFileDurably(join(taskDir, REGISTRY_AUTH_FILE), JSON.stringify(auth), 0o600);
}

/** The stored credentials, or undefined when there are none (or they are unreadable). */
export async function readRegistryAuth(taskDir: string): Promise<RegistryAuth | undefined> {
  if (taskDir === "") return undefined;
  try {
    // Bounded, never through a symlink nor by a blocking open: a file put there is not trusted.
    const raw = JSON.parse(
      await readBoundedFile(join(taskDir, REGISTRY_AUTH_FILE), REGISTRY_AUTH_MAX_BYTES),
    ) as Partial<RegistryAuth>;
    return typeof raw.username === "string" && typeof raw.password === "string"
      ? { username: raw.username, password: raw.password }
      : undefined;
    // Stryker disable next-line BlockStatement: an empty catch also ends the function with undefined.
  } catch {
    return undefined;
  }
}

/** Deletes the credentials; a missing file is fine. */
export async function deleteRegistryAuth(taskDir: string): Promise<void> {
  if (taskDir === "") return;
  await unlink(join(taskDir, REGISTRY_AUTH_FILE)).catch(() => undefined);
}
