import { readFile, unlink } from "node:fs/promises";
import { join } from "node:path";
import { writeFileDurably } from "../state/durable-write.js";
import type { RegistryAuth } from "../tasks/task-config.js";

/**
 * Registry credentials live only here, never in task.json or logs: a 0600 file in the private
 * task dir, kept so a pull cut by a restart can resume, and deleted as soon as the pull ends or
 * the task is released.
 */
export const REGISTRY_AUTH_FILE = "registry-auth.json";

/** Writes the credentials durably (0600). */
export async function writeRegistryAuth(taskDir: string, auth: RegistryAuth): Promise<void> {
  await writeFileDurably(join(taskDir, REGISTRY_AUTH_FILE), JSON.stringify(auth), 0o600);
}

/** The stored credentials, or undefined when there are none (or they are unreadable). */
export async function readRegistryAuth(taskDir: string): Promise<RegistryAuth | undefined> {
  if (taskDir === "") return undefined;
  try {
    const raw = JSON.parse(
      await readFile(join(taskDir, REGISTRY_AUTH_FILE), "utf8"),
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
