import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { errorFields, logExpected } from "./log-fields.js";

function capture(level: string) {
  const lines: Record<string, unknown>[] = [];
  const log = pino(
    { level },
    { write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) },
  );
  return { log, lines };
}

describe("logExpected", () => {
  const error = new Error("createContainer error: Minimum memory limit allowed is 6MB", {
    cause: new Error("(HTTP code 400) bad parameter - Minimum memory limit allowed is 6MB"),
  });

  it("logs the message once, without a stack, at the level given", () => {
    const { log, lines } = capture("info");
    logExpected(log, "warn", { taskId: "t1" }, error, "task failed to start");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      level: 40,
      taskId: "t1",
      error: error.message,
      msg: "task failed to start",
    });
    expect(JSON.stringify(lines[0])).not.toContain("stack");
  });

  it("adds the stack and causes at debug", () => {
    const { log, lines } = capture("debug");
    logExpected(log, "warn", {}, error, "task failed to start");
    expect(lines[1]).toMatchObject({ level: 20, msg: "task failed to start (details)" });
    expect(JSON.stringify(lines[1])).toContain("stack");
  });

  it("takes anything thrown", () => {
    expect(errorFields("plain")).toEqual({ error: "plain" });
  });
});
