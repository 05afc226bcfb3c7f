import { constants } from "node:fs";
import { access } from "node:fs/promises";
import { delimiter, isAbsolute, join } from "node:path";

/**
 * Whether `program` would be found by a spawn: a name with a slash is checked as it is, a bare
 * name in each directory of `PATH` in turn (as execvp searches), executable by this process.
 * A few `access()` calls, against ~20–60 ms for spawning a program that is not installed only to
 * learn so from its ENOENT (the start-up's GPU probes: BENCHMARKS.md, B3).
 */
export async function onPath(program: string, path: string = process.env.PATH ?? ""): Promise<boolean> {
  const candidates = program.includes("/")
    ? [program]
    : path
        .split(delimiter)
        .filter((dir) => dir !== "" && isAbsolute(dir))
        .map((dir) => join(dir, program));
  for (const candidate of candidates) {
    try {
      await access(candidate, constants.X_OK);
      return true;
    } catch {
      // Not here: the next directory.
    }
  }
  return false;
}
