import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { decodeStoredConfig } from "./stored-config.js";
import { decodeTaskState } from "./task-state-file.js";

/*
 * The task.json of every release, as that release wrote it and as that release read it back
 * (test/fixtures/state/<version>/, written by scripts/state-fixtures.ts running the release's own
 * code). Today's decoder must read each to the same task: a release reads everything the ones
 * before it wrote, a config field added since reading as absent. A release that changes the
 * format adds its fixtures; older ones stay.
 */
const ROOT = resolve(import.meta.dirname, "../../test/fixtures/state");
const releases = readdirSync(ROOT).filter((name) => /^\d+\.\d+\.\d+$/.test(name));
const fixtures = releases.flatMap((version) =>
  readdirSync(join(ROOT, version))
    .filter((name) => name.endsWith(".task.json"))
    .map((name) => ({ version, name: name.replace(/\.task\.json$/, ""), dir: join(ROOT, version) })),
);

describe("task.json written by every release", () => {
  it("has fixtures of at least the first release, in every status", () => {
    expect(releases).toContain("1.0.0");
    const statuses = new Set(
      fixtures.map(
        (f) =>
          (JSON.parse(readFileSync(join(f.dir, `${f.name}.task.json`), "utf8")) as { status: string }).status,
      ),
    );
    expect([...statuses].sort()).toEqual([
      "creating",
      "pending",
      "preparing",
      "pulling",
      "running",
      "terminated",
    ]);
  });

  it.each(fixtures)("$version/$name reads to the task that release read", ({ dir, name }) => {
    const text = readFileSync(join(dir, `${name}.task.json`), "utf8");
    const expected = JSON.parse(readFileSync(join(dir, `${name}.decoded.json`), "utf8")) as Record<
      string,
      unknown
    >;
    const decoded = decodeTaskState(text);
    // A config field added after that release is absent from its file, and reads as any absent
    // field does (its zero value or default, from the table of fields): what that release read,
    // plus those fields.
    const config = expected.config as Record<string, unknown>;
    const absent = decodeStoredConfig({ id: config.id, name: config.name, image_name: config.image_name });
    const added = Object.fromEntries(Object.entries(absent).filter(([key]) => !(key in config)));
    expect(decoded).toEqual({ ...expected, config: { ...config, ...added } });
    // Every field of the file is either understood or kept to be written back.
    const raw = JSON.parse(text) as Record<string, unknown>;
    for (const key of Object.keys(raw)) {
      expect(key in decoded || Object.hasOwn(decoded.unknown_fields?.file ?? {}, key), key).toBe(true);
    }
  });
});
