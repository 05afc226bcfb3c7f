import semver from "semver";
import pkg from "../../package.json" with { type: "json" };

/**
 * Why this Node.js cannot run taskshim (outside `engines` of package.json), or `undefined`. The
 * bundle runs on whatever `node` is first on PATH; the single binary carries the pinned one.
 */
export function unsupportedRuntime(
  version: string = process.versions.node,
  required: string = pkg.engines.node,
): string | undefined {
  if (semver.satisfies(version, required)) return undefined;
  return (
    `taskshim needs Node.js ${required}, but ${process.execPath} is v${version}: ` +
    "run the single binary (dist/taskshim), or `npm start` in the project"
  );
}
