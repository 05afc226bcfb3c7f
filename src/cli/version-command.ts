import type { Command } from "@commander-js/extra-typings";
import { BUILD } from "../version.js";

/** What `taskshim version --json` prints: this build and the runtime it carries. */
export interface VersionInfo {
  /** taskshim's own version (package.json at build time). */
  readonly version: string;
  /** The git commit it was built from ("unknown" outside a checkout or unbundled). */
  readonly commit: string;
  /** Whether tracked files differed from `commit` at build time. */
  readonly dirty: boolean;
  /**
   * The content hash of the bundle (scripts/build.mjs), "dev" unbundled: what tells two builds of
   * one version apart. A component check reads it from the installed binary.
   */
  readonly build_id: string;
  /** The Node.js version running it, without the leading `v` (the one embedded in the binary). */
  readonly node: string;
  readonly v8: string;
  readonly platform: string;
  readonly arch: string;
}

/** The versions of this process. */
export function versionInfo(): VersionInfo {
  return {
    version: BUILD.version,
    commit: BUILD.commit,
    dirty: BUILD.dirty,
    build_id: BUILD.buildId,
    node: process.versions.node,
    v8: process.versions.v8,
    platform: process.platform,
    arch: process.arch,
  };
}

/**
 * The human form: the first line is exactly `taskshim --version`'s (`taskshim version X.Y.Z`,
 * which dstack's component check parses), then one line per build and runtime fact.
 */
export function formatVersion(info: VersionInfo): string {
  return [
    `taskshim version ${info.version}`,
    `commit:   ${info.commit}`,
    `dirty:    ${String(info.dirty)}`,
    `build id: ${info.build_id}`,
    `node:     ${info.node}`,
    `v8:       ${info.v8}`,
    `platform: ${info.platform}`,
    `arch:     ${info.arch}`,
  ].join("\n");
}

/** Adds `taskshim version [--json]`. `taskshim --version` stays the one-line version. */
export function addVersionCommand(program: Command): void {
  program
    .command("version")
    .description(
      "print the taskshim version and build (commit, dirty, build id), Node.js and V8 versions, platform and arch",
    )
    .option("--json", "print one JSON object")
    .action((options) => {
      const info = versionInfo();
      process.stdout.write(`${options.json ? JSON.stringify(info) : formatVersion(info)}\n`);
    });
}
