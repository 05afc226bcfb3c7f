import pkg from "../package.json" with { type: "json" };

// Set by scripts/build.mjs only for test builds of other versions (upgrade end-to-end tests).
declare const __TASKSHIM_VERSION__: string | undefined;
// Set by scripts/build.mjs in every bundle (absent when run unbundled, under tsx or vitest).
declare const __TASKSHIM_COMMIT__: string | undefined;
declare const __TASKSHIM_DIRTY__: boolean | undefined;
declare const __TASKSHIM_BUILD_ID__: string | undefined;

/** taskshim's own semver, from package.json at build time. */
export const VERSION: string = typeof __TASKSHIM_VERSION__ === "string" ? __TASKSHIM_VERSION__ : pkg.version;

/**
 * Which build this is. The version alone cannot tell two builds apart (every build of a release
 * carries it, test builds override it); `buildId` can.
 */
export interface BuildIdentity {
  /** The semver ({@link VERSION}). */
  readonly version: string;
  /** `git rev-parse HEAD` of the tree it was built from; "unknown" outside a git checkout. */
  readonly commit: string;
  /** Whether tracked files differed from `commit` at build time (untracked files are not counted). */
  readonly dirty: boolean;
  /**
   * The first 20 hex digits of the sha256 of the bundle itself (scripts/build.mjs): two builds of
   * different code never share it, two identical builds do. "dev" when run unbundled.
   */
  readonly buildId: string;
}

/** This process's build identity (the defaults are those of an unbundled run under tsx or vitest). */
export const BUILD: BuildIdentity = {
  version: VERSION,
  commit: typeof __TASKSHIM_COMMIT__ === "string" ? __TASKSHIM_COMMIT__ : "unknown",
  dirty: typeof __TASKSHIM_DIRTY__ === "boolean" ? __TASKSHIM_DIRTY__ : false,
  buildId: typeof __TASKSHIM_BUILD_ID__ === "string" ? __TASKSHIM_BUILD_ID__ : "dev",
};
