import { execFile } from "node:child_process";
import { copyFile, mkdir, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import semver from "semver";

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "../..");

/** A release of taskshim: its version and the commit its tag points at. */
export interface Release {
  readonly version: string;
  readonly commit: string;
}

/**
 * The release before the build under test: the newest release whose source differs from this
 * checkout's (src/, scripts/, package files), so that work after a release at the same version
 * number is tested against that release, and a checkout of a release itself against the one
 * before it. Its commit comes from releases.json (written by scripts/release.mjs); where the
 * clone has the tag `vX.Y.Z`, the tag must agree.
 */
export async function previousRelease(): Promise<Release> {
  const listed = (
    JSON.parse(await readFile(join(ROOT, "releases.json"), "utf8")) as {
      releases: { version: string; tag: string; commit: string }[];
    }
  ).releases.sort((a, b) => semver.rcompare(a.version, b.version));
  for (const release of listed) {
    const tagged = await git("rev-parse", "--verify", "--quiet", `${release.tag}^{commit}`).catch(
      () => undefined,
    );
    if (tagged !== undefined && tagged !== release.commit) {
      throw new Error(`tag ${release.tag} is ${tagged}, but releases.json says ${release.commit}`);
    }
    const same = await git(
      "diff",
      "--quiet",
      release.commit,
      "--",
      "src",
      "scripts",
      "package.json",
      "package-lock.json",
    ).then(
      () => true,
      () => false,
    );
    if (!same) return { version: release.version, commit: release.commit };
  }
  throw new Error("no release in releases.json whose source differs from this checkout");
}

const git = async (...args: string[]): Promise<string> =>
  (await exec("git", ["-C", ROOT, ...args])).stdout.trim();

/**
 * The single binary of a release, built once from a git worktree of its commit with its own
 * `npm ci` and `npm run build:binary` (its own pinned Node.js and dependencies), and kept in a
 * cache that later runs reuse: `TASKSHIM_RELEASE_CACHE`, else /var/cache/taskshim-test/releases.
 */
export async function releaseBinary(release: Release): Promise<string> {
  const cache = join(
    process.env.TASKSHIM_RELEASE_CACHE ?? "/var/cache/taskshim-test/releases",
    release.commit,
  );
  const binary = join(cache, "taskshim");
  const usable = await exec(binary, ["--version"], { timeout: 30_000 }).then(
    ({ stdout }) => stdout.trim() === `taskshim version ${release.version}`,
    () => false,
  );
  if (usable) return binary;
  const worktree = await mkdtemp(join(tmpdir(), `taskshim-release-${release.version}-`));
  const started = performance.now();
  try {
    await exec("git", ["-C", ROOT, "worktree", "add", "--detach", worktree, release.commit]);
    const options = { cwd: worktree, timeout: 15 * 60_000, maxBuffer: 64 * 1024 * 1024 };
    await exec("npm", ["ci", "--no-audit", "--no-fund", "--loglevel=error"], options);
    await exec("npm", ["run", "build:binary"], options);
    await mkdir(cache, { recursive: true });
    await copyFile(join(worktree, "dist", "taskshim"), `${binary}.tmp`);
    await exec("mv", ["-f", `${binary}.tmp`, binary]);
    await stat(binary);
  } finally {
    await exec("git", ["-C", ROOT, "worktree", "remove", "--force", worktree]).catch(() => undefined);
    await rm(worktree, { recursive: true, force: true });
  }
  console.log(
    `built release ${release.version} (${release.commit.slice(0, 7)}) in ${Math.round((performance.now() - started) / 1000)} s: ${binary}`,
  );
  return binary;
}
