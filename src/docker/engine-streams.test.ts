import { describe, expect, it } from "vitest";
import { parseEvent, splitLogLines } from "./engine-streams.js";

describe("parseEvent", () => {
  const line = (attributes: Record<string, string>, action = "die") =>
    JSON.stringify({ Type: "container", Action: action, Actor: { ID: "c0ffee", Attributes: attributes } });

  it("carries a die event's exitCode attribute", () => {
    expect(parseEvent(line({ "ai.dstack.shim.task-id": "t1", exitCode: "0" }))).toEqual({
      action: "die",
      containerId: "c0ffee",
      taskId: "t1",
      owner: "",
      exitCode: 0,
    });
    expect(parseEvent(line({ "ai.dstack.shim.task-id": "t1", exitCode: "137" }))?.exitCode).toBe(137);
  });

  it("leaves the exit code out when the event has none or a malformed one", () => {
    expect(parseEvent(line({ "ai.dstack.shim.task-id": "t1" }, "start"))).toEqual({
      action: "start",
      containerId: "c0ffee",
      taskId: "t1",
      owner: "",
    });
    expect(parseEvent(line({ "ai.dstack.shim.task-id": "t1", exitCode: "-1" }))).not.toHaveProperty(
      "exitCode",
    );
    expect(parseEvent(line({ "ai.dstack.shim.task-id": "t1", exitCode: "" }))).not.toHaveProperty("exitCode");
  });

  it("ignores events of containers that are not tasks, and lines that are not JSON", () => {
    expect(parseEvent(line({ exitCode: "0" }))).toBeUndefined();
    expect(parseEvent("not json")).toBeUndefined();
  });
});

describe("splitLogLines", () => {
  it("splits on LF and CRLF without the trailing empty line", () => {
    expect(splitLogLines("out1\r\nerr\nout2\n")).toEqual(["out1", "err", "out2"]);
    expect(splitLogLines("")).toEqual([]);
    expect(splitLogLines("no newline")).toEqual(["no newline"]);
  });
});
