import semver from "semver";
import pkg from "../../package.json" with { type: "json" };

/**
 * The Node.js versions taskshim runs on, parsed once: when the bundle loads, which for the single
 * binary is at build time (its startup snapshot holds the parsed range, so a start does not parse it).
 */
const SUPPORTED = new semver.Range(pkg.engines.node);

/**
 * Why this Node.js cannot run taskshim (outside `engines` of package.json), or `undefined`. The
 * bundle runs on whatever `node` is first on PATH; the single binary carries the pinned one.
 */
export function unsupportedRuntime(
  version: string = process.versions.node,
  required: string | semver.Range = SUPPORTED,
): string | undefined {
  if (semver.satisfies(version, required)) return undefined;
  return (
    `taskshim needs Node.js ${typeof required === "string" ? required : required.raw}, but ${process.execPath} is v${version}: ` +
    "run the single binary (dist/taskshim), or `npm start` in the project"
  );
}
