import pkg from "../package.json" with { type: "json" };

/** taskshim's own semver, from package.json at build time. */
export const VERSION: string = pkg.version;
