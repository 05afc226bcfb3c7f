import { readdir, unlink } from "node:fs/promises";
import { join } from "node:path";
import { createFileDurably, tempFilePrefix } from "./durable-write.js";

/** The file's name in the shim home, as dstack's server reads it. */
export const HOST_INFO_FILE = "host_info.json";

/**
 * Writes service mode's `<home>/host_info.json` unless a file (or anything else) is there:
 * `"exists"` then, and nothing is written, as dstack-shim does (the server deletes the file
 * before each deploy, so a file there is one this or an earlier start wrote). Complete or absent
 * after a crash at any instant; temp files a crash left behind are removed first.
 */
export async function writeHostInfo(home: string, info: object): Promise<"created" | "exists"> {
  const target = join(home, HOST_INFO_FILE);
  const prefix = tempFilePrefix(target);
  const stale = (await readdir(home)).filter((name) => name.startsWith(prefix));
  await Promise.all(stale.map((name) => unlink(join(home, name)).catch(() => undefined)));
  // 0644, as dstack-shim's os.Create leaves it: nothing in it is secret.
  return createFileDurably(target, JSON.stringify(info), 0o644);
}
