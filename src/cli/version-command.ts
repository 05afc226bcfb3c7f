import type { Command } from "@commander-js/extra-typings";
import { VERSION } from "../version.js";

/** What `taskshim version --json` prints: this build and the runtime it carries. */
export interface VersionInfo {
  /** taskshim's own version (package.json at build time). */
  readonly version: string;
  /** The Node.js version running it, without the leading `v` (the one embedded in the binary). */
  readonly node: string;
  readonly v8: string;
  readonly platform: string;
  readonly arch: string;
}

/** The versions of this process. */
export function versionInfo(): VersionInfo {
  return {
    version: VERSION,
    node: process.versions.node,
    v8: process.versions.v8,
    platform: process.platform,
    arch: process.arch,
  };
}

/**
 * The human form: the first line is exactly `taskshim --version`'s (`taskshim version X.Y.Z`,
 * which dstack's component check parses), then one line per runtime fact.
 */
export function formatVersion(info: VersionInfo): string {
  return [
    `taskshim version ${info.version}`,
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
    .description("print the taskshim, Node.js and V8 versions, platform and arch")
    .option("--json", "print one JSON object")
    .action((options) => {
      const info = versionInfo();
      process.stdout.write(`${options.json ? JSON.stringify(info) : formatVersion(info)}\n`);
    });
}
