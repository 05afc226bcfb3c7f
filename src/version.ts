import pkg from "../package.json" with { type: "json" };

// Set by scripts/build.mjs only for test builds of other versions (upgrade end-to-end tests).
declare const __TASKSHIM_VERSION__: string | undefined;

/** taskshim's own semver, from package.json at build time. */
export const VERSION: string = typeof __TASKSHIM_VERSION__ === "string" ? __TASKSHIM_VERSION__ : pkg.version;
