// Cuts a release: checks that CHANGELOG.md has a section for the version, bumps package.json and
// package-lock.json, commits, tags `vX.Y.Z` (annotated, with the changelog section as its
// message), and records the tag's commit in releases.json (a clone without tags still finds the
// release: test/support/releases.ts). Once tagged, it writes the release's binaries, the files of
// dstack's DSTACK_SHIM_DOWNLOAD_URL, into dist/release/ (scripts/release-artifacts.mjs).
//   npm run release -- X.Y.Z [--dry-run]
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import semver from "semver";

const { values, positionals } = parseArgs({
  options: { "dry-run": { type: "boolean", default: false } },
  allowPositionals: true,
});
const git = (...args) => execFileSync("git", args, { encoding: "utf8" }).trim();
const fail = (message) => {
  console.error(`release: ${message}`);
  process.exit(1);
};

const version = positionals[0];
if (!version || semver.valid(version) !== version) fail("usage: npm run release -- X.Y.Z [--dry-run]");
const pkg = JSON.parse(readFileSync("package.json", "utf8"));
if (!semver.gt(version, pkg.version)) fail(`${version} is not newer than package.json's ${pkg.version}`);
const tag = `v${version}`;
if (git("tag", "--list", tag) !== "") fail(`tag ${tag} exists already`);
if (git("status", "--porcelain", "--untracked-files=no") !== "")
  fail("the work tree has uncommitted changes");
if (git("rev-parse", "--abbrev-ref", "HEAD") !== "main") fail("releases are cut on main");

const changelog = readFileSync("CHANGELOG.md", "utf8");
const heading = new RegExp(`^## \\[${version.replaceAll(".", "\\.")}\\] - (\\d{4}-\\d{2}-\\d{2})$`, "m");
const found = heading.exec(changelog);
if (!found) fail(`CHANGELOG.md has no "## [${version}] - YYYY-MM-DD" section (rename [Unreleased] to it)`);
const rest = changelog.slice(found.index + found[0].length);
const section = rest.slice(0, rest.search(/^## \[/m) === -1 ? undefined : rest.search(/^## \[/m)).trim();
if (!/^- /m.test(section)) fail(`CHANGELOG.md's section for ${version} lists no change`);

if (values["dry-run"]) {
  console.log(
    `release: ${version} is ready to cut (${section.split("\n").filter((l) => l.startsWith("- ")).length} entries)`,
  );
  process.exit(0);
}
execFileSync("npm", ["version", version, "--no-git-tag-version", "--ignore-scripts"], { stdio: "inherit" });
git("add", "package.json", "package-lock.json");
git("commit", "-q", "-m", `Release ${version}`);
git("tag", "-a", tag, "-m", `taskshim ${version}\n\n${section}`);
const commit = git("rev-parse", `${tag}^{commit}`);
// Built here, while HEAD is the tag's commit and the tree clean: every binary names the commit it
// was built from (scripts/build.mjs), and the one below only adds releases.json. A failure does
// not stop the release from being recorded: it says how to build them again.
const artifacts = spawnSync(process.execPath, ["scripts/release-artifacts.mjs"], { stdio: "inherit" });
const releases = JSON.parse(readFileSync("releases.json", "utf8"));
releases.releases.push({ version, tag, commit });
writeFileSync("releases.json", `${JSON.stringify(releases, null, 2)}\n`);
execFileSync("npx", ["prettier", "--write", "releases.json"], { stdio: "ignore" });
git("add", "releases.json");
git("commit", "-q", "-m", `releases.json: ${version} is ${commit.slice(0, 12)}`);
console.log(`release: ${tag} at ${commit}. If this release changed the task.json format, add its fixtures:`);
console.log(`  npx tsx scripts/state-fixtures.ts ${tag}`);
if (artifacts.status !== 0) {
  fail(
    `${tag} is cut, but not its binaries: \`git checkout ${tag} && npm run release:artifacts; git checkout main\``,
  );
}
