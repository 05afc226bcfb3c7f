import { describe, expect, it } from "vitest";
import {
  InvalidCleanupEvidenceError,
  parseCleanupEvidence,
  type CleanupEvidence,
} from "./cleanup-evidence.js";

const evidence: CleanupEvidence = {
  trigger: "deadline",
  elapsed_ms: 12,
  reap_grace_ms: 5_000,
  io_drain_grace_ms: 5_000,
  kill_attempted: true,
  verified: false,
  error: "pipes not drained within 5000 ms",
};

const withField = (key: string, value: unknown): string => JSON.stringify({ ...evidence, [key]: value });
const without = (key: keyof CleanupEvidence): string => {
  const copy: Record<string, unknown> = { ...evidence };
  delete copy[key];
  return JSON.stringify(copy);
};

describe("parseCleanupEvidence", () => {
  it("round-trips every trigger through JSON", () => {
    for (const trigger of ["deadline", "interruption", "wait_failure"] as const) {
      const value: CleanupEvidence = { ...evidence, trigger, verified: true, error: null };
      expect(parseCleanupEvidence(JSON.stringify(value))).toEqual(value);
    }
    expect(parseCleanupEvidence(JSON.stringify(evidence))).toEqual(evidence);
  });

  it("rejects an unknown field", () => {
    expect(() => parseCleanupEvidence(withField("pid", 1234))).toThrow(InvalidCleanupEvidenceError);
  });

  it.each(Object.keys(evidence) as (keyof CleanupEvidence)[])("rejects evidence without %s", (key) => {
    expect(() => parseCleanupEvidence(without(key))).toThrow(InvalidCleanupEvidenceError);
  });

  it.each([
    ["trigger", "timeout"],
    ["trigger", null],
    ["elapsed_ms", "12"],
    ["elapsed_ms", -1],
    ["elapsed_ms", 1.5],
    ["reap_grace_ms", null],
    ["io_drain_grace_ms", true],
    ["kill_attempted", "true"],
    ["verified", 1],
    ["error", 5],
    ["error", { message: "x" }],
  ])("rejects %s = %j", (key, value) => {
    expect(() => parseCleanupEvidence(withField(key, value))).toThrow(InvalidCleanupEvidenceError);
  });

  it.each(["", "{", "not json", "null", "[]", '"deadline"', "42"])("rejects the text %j", (text) => {
    expect(() => parseCleanupEvidence(text)).toThrow(InvalidCleanupEvidenceError);
  });
});

describe("parseCleanupEvidence errors", () => {
  const failure = (text: string): InvalidCleanupEvidenceError => {
    try {
      parseCleanupEvidence(text);
    } catch (error) {
      return error as InvalidCleanupEvidenceError;
    }
    throw new Error("accepted");
  };

  it("says the text is not JSON, with the parser's error as the cause", () => {
    const error = failure("{");
    expect(error.name).toBe("InvalidCleanupEvidenceError");
    expect(error.message).toBe("cleanup evidence is not JSON");
    expect(error.cause).toBeInstanceOf(SyntaxError);
  });

  it("names the first field that is wrong, or the root", () => {
    expect(failure(withField("elapsed_ms", -1)).message).toBe(
      "invalid cleanup evidence: /elapsed_ms must be >= 0",
    );
    expect(failure(withField("reap_grace_ms", -1)).message).toBe(
      "invalid cleanup evidence: /reap_grace_ms must be >= 0",
    );
    expect(failure(withField("io_drain_grace_ms", -1)).message).toBe(
      "invalid cleanup evidence: /io_drain_grace_ms must be >= 0",
    );
    expect(failure("null").message).toMatch(/^invalid cleanup evidence: \/ \S/);
  });
});
