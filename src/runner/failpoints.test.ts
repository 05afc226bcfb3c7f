import { afterEach, describe, expect, it } from "vitest";
import {
  armFailpoints,
  failpoint,
  FailpointError,
  InvalidFailpointsError,
  parseFailpoints,
} from "./failpoints.js";

afterEach(() => armFailpoints(undefined));

describe("failpoints", () => {
  it("are off by default: a point returns undefined synchronously", () => {
    expect(failpoint("after-taskdir")).toBeUndefined();
  });

  it("parse actions with arguments and counts", () => {
    const parsed = parseFailpoints("a=kill, b=2*delay(250), c=error(disk full), d=hang, e=exit(3)");
    expect(parsed.get("a")).toEqual({ action: { kind: "kill" }, remaining: Infinity });
    expect(parsed.get("b")).toEqual({ action: { kind: "delay", ms: 250 }, remaining: 2 });
    expect(parsed.get("c")?.action).toEqual({ kind: "error", message: "disk full" });
    expect(parsed.get("d")?.action).toEqual({ kind: "hang" });
    expect(parsed.get("e")?.action).toEqual({ kind: "exit", code: 3 });
  });

  it("reject a spec they cannot parse", () => {
    expect(() => parseFailpoints("a=explode")).toThrow(InvalidFailpointsError);
    expect(() => parseFailpoints("noaction")).toThrow(InvalidFailpointsError);
  });

  it("fire an error only as often as counted, and only at the named point", async () => {
    armFailpoints("after-state:running=1*error(boom)");
    expect(failpoint("after-state:pulling")).toBeUndefined();
    await expect(failpoint("after-state:running")).rejects.toThrow(FailpointError);
    expect(failpoint("after-state:running")).toBeUndefined();
  });

  it("delay a step", async () => {
    armFailpoints("mid-pull=delay(50)");
    const started = Date.now();
    await failpoint("mid-pull");
    expect(Date.now() - started).toBeGreaterThanOrEqual(45);
  });
});
