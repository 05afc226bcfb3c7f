import { describe, expect, it } from "vitest";
import {
  isTransitionAllowed,
  TASK_STATUSES,
  TransitionNotAllowedError,
  type TaskStatus,
} from "./task-status.js";

/** The landed (#4203) rules: `from` statuses allowed for each `to`. */
const EXPECTED: Record<TaskStatus, readonly TaskStatus[]> = {
  pending: [],
  preparing: ["pending"],
  pulling: ["preparing"],
  creating: ["pulling"],
  running: ["creating"],
  terminated: ["pending", "preparing", "pulling", "creating", "running", "terminated"],
};

const pairs = TASK_STATUSES.flatMap((from) => TASK_STATUSES.map((to) => [from, to] as const));

describe("task statuses", () => {
  it("are the six wire statuses in lifecycle order", () => {
    expect(TASK_STATUSES).toEqual(["pending", "preparing", "pulling", "creating", "running", "terminated"]);
  });

  it.each(pairs.filter(([from, to]) => EXPECTED[to].includes(from)))("allows %s -> %s", (from, to) => {
    expect(isTransitionAllowed(from, to)).toBe(true);
  });

  it.each(pairs.filter(([from, to]) => !EXPECTED[to].includes(from)))("forbids %s -> %s", (from, to) => {
    expect(isTransitionAllowed(from, to)).toBe(false);
  });

  it("allows running only from creating (not running -> running any more)", () => {
    expect(TASK_STATUSES.filter((from) => isTransitionAllowed(from, "running"))).toEqual(["creating"]);
  });

  it("allows terminated from every status", () => {
    expect(TASK_STATUSES.every((from) => isTransitionAllowed(from, "terminated"))).toBe(true);
  });

  it("names both ends in the error message, like dstack-shim", () => {
    const error = new TransitionNotAllowedError("pending", "running");
    expect(error.message).toBe("pending -> running transition not allowed");
    expect(error.from).toBe("pending");
    expect(error.to).toBe("running");
    expect(error).toBeInstanceOf(Error);
  });
});
