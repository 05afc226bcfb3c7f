import { describe, expect, it } from "vitest";
import {
  IllegalShimTransitionError,
  SHIM_PHASES,
  ShimLifecycle,
  type ShimPhase,
  type ShimPhaseView,
} from "./shim-lifecycle.js";

function recorder() {
  const lines: { level: "info" | "error"; fields: Record<string, unknown>; message: string }[] = [];
  return {
    lines,
    log: {
      info: (fields: Record<string, unknown>, message: string) =>
        lines.push({ level: "info", fields, message }),
      error: (fields: Record<string, unknown>, message: string) =>
        lines.push({ level: "error", fields, message }),
    },
  };
}

describe("ShimLifecycle", () => {
  it("starts in starting and walks the whole way to stopped, logging each transition once", () => {
    let clock = 1_000;
    const { lines, log } = recorder();
    const life = new ShimLifecycle(log, () => clock);
    expect(life.view).toEqual({ phase: "starting", since: new Date(1_000).toISOString() });
    for (const next of ["restoring", "serving", "draining", "stopped"] as const) {
      clock += 10;
      life.to(next);
      expect(life.view).toEqual({ phase: next, since: new Date(clock).toISOString() });
    }
    expect(lines.map((l) => [l.level, l.fields.from, l.fields.phase, l.message])).toEqual([
      ["info", "starting", "restoring", "shim phase"],
      ["info", "restoring", "serving", "shim phase"],
      ["info", "serving", "draining", "shim phase"],
      ["info", "draining", "stopped", "shim phase"],
    ]);
  });

  it("refuses a transition the table does not allow and stays where it was", () => {
    const { lines, log } = recorder();
    const life = new ShimLifecycle(log);
    expect(() => life.to("serving")).toThrow(IllegalShimTransitionError);
    expect(() => life.to("stopped")).toThrow("starting → stopped is not a transition");
    expect(life.phase).toBe("starting");
    expect(lines).toEqual([]);
  });

  it("drains from starting and restoring (a signal before serving), then stops; never serves after", () => {
    for (const path of [[], ["restoring"]] as ShimPhase[][]) {
      const { lines, log } = recorder();
      const life = new ShimLifecycle(log);
      for (const phase of path) life.to(phase);
      life.to("draining", { interruptedBy: "SIGTERM" });
      expect(() => life.to("serving")).toThrow(IllegalShimTransitionError);
      expect(() => life.to("restoring")).toThrow(IllegalShimTransitionError);
      life.to("stopped", { outcome: "interrupted" });
      expect(lines.at(-1)).toMatchObject({ level: "info", fields: { phase: "stopped", from: "draining" } });
    }
  });

  it("fails from every phase that has not ended, at error level with the detail, and never leaves an end", () => {
    for (const path of [
      [],
      ["restoring"],
      ["restoring", "serving"],
      ["restoring", "serving", "draining"],
    ] as ShimPhase[][]) {
      const { lines, log } = recorder();
      const life = new ShimLifecycle(log);
      for (const phase of path) life.to(phase);
      life.to("failed", { error: "boom" });
      expect(lines.at(-1)).toMatchObject({ level: "error", fields: { phase: "failed", error: "boom" } });
      for (const phase of SHIM_PHASES) expect(() => life.to(phase)).toThrow(IllegalShimTransitionError);
    }
  });

  it("tells listeners each transition until they unsubscribe", () => {
    const life = new ShimLifecycle(recorder().log, () => 0);
    const seen: ShimPhaseView[] = [];
    const unsubscribe = life.onChange((view) => seen.push(view));
    life.to("restoring");
    unsubscribe();
    life.to("serving");
    expect(seen).toEqual([{ phase: "restoring", since: new Date(0).toISOString() }]);
  });
});
