import { afterEach, describe, expect, it, vi } from "vitest";
import {
  armFailpoints,
  failpoint,
  FailpointError,
  FAILPOINTS_ENV,
  InvalidFailpointsError,
  parseFailpoints,
} from "./failpoints.js";

afterEach(() => {
  armFailpoints(undefined);
  vi.restoreAllMocks();
});

/** Whether `promise` is still pending after a few turns of the event loop. */
async function pending(promise: Promise<void> | undefined): Promise<boolean> {
  let settled = false;
  void promise?.then(
    () => (settled = true),
    () => (settled = true),
  );
  await new Promise((resolve) => setTimeout(resolve, 20));
  return promise !== undefined && !settled;
}

describe("failpoints", () => {
  it("are armed through the documented environment variable", () => {
    expect(FAILPOINTS_ENV).toBe("TASKSHIM_FAILPOINTS");
  });

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

  it("parse a count of several digits and the defaults of actions given without an argument", () => {
    const parsed = parseFailpoints("a=12*exit,b=delay,c=error,d=error(),e=kill(),f=exit()");
    expect(parsed.get("a")).toEqual({ action: { kind: "exit", code: 1 }, remaining: 12 });
    expect(parsed.get("b")?.action).toEqual({ kind: "delay", ms: 1000 });
    expect(parsed.get("c")?.action).toEqual({ kind: "error", message: "failpoint" });
    expect(parsed.get("d")?.action).toEqual({ kind: "error", message: "failpoint" });
    expect(parsed.get("e")?.action).toEqual({ kind: "kill" });
    expect(parsed.get("f")?.action).toEqual({ kind: "exit", code: 1 });
  });

  it("ignore empty entries and the blanks around an entry", () => {
    const parsed = parseFailpoints(" ,a=kill ,, b=hang,");
    expect([...parsed.keys()]).toEqual(["a", "b"]);
  });

  it("reject a spec they cannot parse, naming the entry or action", () => {
    expect(() => parseFailpoints("a=explode")).toThrow(
      new InvalidFailpointsError('unknown failpoint action "explode"'),
    );
    expect(() => parseFailpoints("noaction")).toThrow(
      new InvalidFailpointsError('failpoint entry "noaction" has no action'),
    );
    expect(() => parseFailpoints("=kill")).toThrow(
      new InvalidFailpointsError('failpoint entry "=kill" has no action'),
    );
    for (const action of ["killed", "xkill", "x2*kill", "2*", "*kill", "kill(", "error(a)b"]) {
      expect(() => parseFailpoints(`a=${action}`), action).toThrow(InvalidFailpointsError);
    }
    expect(new InvalidFailpointsError("x").name).toBe("InvalidFailpointsError");
  });

  it("arm and disarm from a spec: undefined or empty disarms", async () => {
    armFailpoints("p=error(boom)");
    await expect(failpoint("p")).rejects.toThrow("failpoint p: boom");
    armFailpoints("");
    expect(failpoint("p")).toBeUndefined();
    armFailpoints("p=error(boom)");
    armFailpoints(undefined);
    expect(failpoint("p")).toBeUndefined();
  });

  it("fire an error only as often as counted, and only at the named point", async () => {
    armFailpoints("after-state:running=1*error(boom)");
    expect(failpoint("after-state:pulling")).toBeUndefined();
    await expect(failpoint("after-state:running")).rejects.toThrow(FailpointError);
    expect(failpoint("after-state:running")).toBeUndefined();
  });

  it("fire every time without a count", async () => {
    armFailpoints("p=error(boom)");
    for (let i = 0; i < 3; i++) await expect(failpoint("p")).rejects.toThrow("failpoint p: boom");
  });

  it("throw an error with the errno code for error(EIO), and a plain one otherwise", async () => {
    armFailpoints(
      "a=error(ENOSPC),b=error(disk full),c=error(E),d=error(xEIO),e=error(EIO now),f=error(E2BIG)",
    );
    const errno = await failpoint("a")?.catch((e: unknown) => e);
    expect(errno).toBeInstanceOf(FailpointError);
    expect(errno).toMatchObject({
      name: "FailpointError",
      code: "ENOSPC",
      message: "ENOSPC: injected by failpoint a",
    });
    expect(await failpoint("f")?.catch((e: unknown) => e)).toMatchObject({ code: "E2BIG" });
    for (const [point, text] of [
      ["b", "disk full"],
      ["c", "E"],
      ["d", "xEIO"],
      ["e", "EIO now"],
    ] as const) {
      const plain = await failpoint(point)?.catch((e: unknown) => e);
      expect(plain, point).toMatchObject({ name: "FailpointError", message: `failpoint ${point}: ${text}` });
      expect((plain as FailpointError).code, point).toBeUndefined();
    }
  });

  it("delay a step", async () => {
    armFailpoints("mid-pull=delay(50)");
    const started = Date.now();
    await failpoint("mid-pull");
    expect(Date.now() - started).toBeGreaterThanOrEqual(45);
  });

  it("hang a step: the promise never settles", async () => {
    armFailpoints("p=hang");
    expect(await pending(failpoint("p"))).toBe(true);
  });

  it("kill the process with SIGKILL, and never let the step go on", async () => {
    const kill = vi.spyOn(process, "kill").mockImplementation(() => true);
    armFailpoints("p=kill");
    const step = failpoint("p");
    expect(kill).toHaveBeenCalledExactlyOnceWith(process.pid, "SIGKILL");
    expect(await pending(step)).toBe(true);
  });

  it("exit the process with the given code", () => {
    const exit = vi.spyOn(process, "exit").mockImplementation(() => undefined as never);
    armFailpoints("p=exit(7),q=exit");
    void failpoint("p");
    void failpoint("q");
    expect(exit.mock.calls).toEqual([[7], [1]]);
  });
});
