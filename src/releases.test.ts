import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import semver from "semver";
import { describe, expect, it } from "vitest";

/*
 * The release record agrees with itself: every release in releases.json has its section in
 * CHANGELOG.md and its fixtures of task.json, package.json's version is a release or the next
 * one being prepared, and where the clone has tags, each tag points at the recorded commit.
 */
const ROOT = resolve(import.meta.dirname, "..");
const read = (path: string): string => readFileSync(resolve(ROOT, path), "utf8");
const releases = (
  JSON.parse(read("releases.json")) as { releases: { version: string; tag: string; commit: string }[] }
).releases;
const changelog = read("CHANGELOG.md");
const version = (JSON.parse(read("package.json")) as { version: string }).version;

describe("releases", () => {
  it.each(releases)("$version has a dated CHANGELOG section and tag v$version", (release) => {
    expect(release.tag).toBe(`v${release.version}`);
    expect(release.commit).toMatch(/^[0-9a-f]{40}$/);
    expect(changelog).toMatch(
      new RegExp(`^## \\[${release.version.replaceAll(".", "\\.")}\\] - \\d{4}-\\d{2}-\\d{2}$`, "m"),
    );
  });

  it("package.json's version is the newest release, or the [Unreleased] work after it", () => {
    const newest = releases.at(-1)?.version ?? "0.0.0";
    expect(semver.gte(version, newest)).toBe(true);
    if (version === newest) return;
    // Between releases the version stays at the last one and the changes wait under [Unreleased].
    expect(changelog).toMatch(/^## \[Unreleased\]$/m);
  });

  it("has task.json fixtures of the first release", () => {
    expect(() => read("test/fixtures/state/1.0.0/running.task.json")).not.toThrow();
  });

  it("where the clone has the tags, each points at the commit releases.json records", () => {
    for (const release of releases) {
      let tagged: string | undefined;
      try {
        tagged = execFileSync(
          "git",
          ["-C", ROOT, "rev-parse", "--verify", "--quiet", `${release.tag}^{commit}`],
          {
            encoding: "utf8",
            stdio: ["ignore", "pipe", "ignore"],
          },
        ).trim();
      } catch {
        tagged = undefined; // a clone without tags: releases.json is the record
      }
      if (tagged !== undefined) expect(tagged).toBe(release.commit);
    }
  });
});
