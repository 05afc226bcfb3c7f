import { describe, expect, it } from "vitest";
import {
  isTerminationReason,
  normalizeTerminationReason,
  TERMINATION_REASONS,
} from "./termination-reason.js";

describe("termination reasons", () => {
  it("include dstack-shim's own constants", () => {
    for (const reason of [
      "executor_error",
      "creating_container_error",
      "container_exited_with_error",
      "done_by_runner",
      "terminated_by_user",
      "terminated_by_server",
      "max_duration_exceeded",
      "log_quota_exceeded",
    ]) {
      expect(TERMINATION_REASONS).toContain(reason);
    }
  });

  it("are unique, lower-case values", () => {
    expect(new Set(TERMINATION_REASONS).size).toBe(TERMINATION_REASONS.length);
    for (const reason of TERMINATION_REASONS) expect(reason).toMatch(/^[a-z_]+$/);
  });

  it("isTerminationReason accepts only exact known values", () => {
    expect(isTerminationReason("terminated_by_user")).toBe(true);
    expect(isTerminationReason("TERMINATED_BY_USER")).toBe(false);
    expect(isTerminationReason("")).toBe(false);
    expect(isTerminationReason("container_missing")).toBe(false);
  });
});

describe("normalizeTerminationReason", () => {
  it("lower-cases and trims a known reason", () => {
    expect(normalizeTerminationReason(" Terminated_By_User\n", "terminated_by_server")).toBe(
      "terminated_by_user",
    );
    expect(normalizeTerminationReason("MAX_DURATION_EXCEEDED", "terminated_by_server")).toBe(
      "max_duration_exceeded",
    );
  });

  it("falls back for an empty reason (the dangling-task cleanup sends one)", () => {
    expect(normalizeTerminationReason("", "terminated_by_server")).toBe("terminated_by_server");
    expect(normalizeTerminationReason("   ", "executor_error")).toBe("executor_error");
  });

  it("falls back for a value the server could not parse back", () => {
    expect(normalizeTerminationReason("because I said so", "terminated_by_server")).toBe(
      "terminated_by_server",
    );
    expect(normalizeTerminationReason("terminated-by-user", "executor_error")).toBe("executor_error");
  });
});
