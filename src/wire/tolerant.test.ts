import Type from "typebox";
import Value from "typebox/value";
import { describe, expect, it } from "vitest";
import { newTask } from "../tasks/task.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import {
  ComponentsView,
  HealthcheckView,
  TaskEventView,
  TaskInfoView,
  TaskListView,
} from "./client-views.js";
import { Components, Healthcheck, TaskInfo } from "./schemas.js";
import { taskEvent, taskInfo } from "./task-answers.js";
import { open, tolerant } from "./tolerant.js";

const health = {
  service: "dstack-shim",
  version: "1.2.0",
  implementation: "taskshim",
  engine: { status: "up", since: "2026-01-01T00:00:00.000Z", kind: "docker", version: "28.0.1" },
  storage: { status: "ok", since: "2026-01-01T00:00:00.000Z" },
  lifecycle: { phase: "serving", since: "2026-01-01T00:00:00.000Z" },
  build: { commit: "abc", dirty: false, build_id: "9f86d081884c7d659a2f" },
};

describe("the client's tolerant views of the server's schemas", () => {
  it("read every answer the server sends", () => {
    const { config } = parseTaskConfig({ id: "t1", name: "job", image_name: "busybox:1.36" });
    const task = newTask(config);
    expect(Value.Check(Healthcheck, health)).toBe(true);
    expect(Value.Check(HealthcheckView, health)).toBe(true);
    expect(Value.Check(TaskInfo, taskInfo(task))).toBe(true);
    expect(Value.Check(TaskInfoView, taskInfo(task))).toBe(true);
    expect(Value.Check(TaskEventView, taskEvent({ kind: "present", task }))).toBe(true);
    expect(Value.Check(TaskListView, { tasks: [{ id: "t1", status: "pending" }] })).toBe(true);
  });

  it("read dstack-shim's and older taskshims' answers, which lack the extensions", () => {
    expect(Value.Check(Healthcheck, { service: "dstack-shim", version: "0.19.26" })).toBe(false);
    expect(Value.Check(HealthcheckView, { service: "dstack-shim", version: "0.19.26" })).toBe(true);
    const core = { id: "t1", status: "running", termination_reason: "", termination_message: "" };
    expect(Value.Check(TaskInfo, core)).toBe(false);
    expect(Value.Check(TaskInfoView, core)).toBe(true);
    const runner = { name: "dstack-runner", version: "0.19.26", status: "installed" };
    expect(Value.Check(ComponentsView, { components: [runner] })).toBe(true);
  });

  it("accept a value a newer shim adds to an open enum; the server still sends only its own", () => {
    const newer = {
      ...health,
      service: "another-shim",
      engine: { status: "degraded", kind: "containerd" },
      lifecycle: { phase: "upgrading", since: "2026-01-01T00:00:00.000Z" },
    };
    expect(Value.Check(HealthcheckView, newer)).toBe(true);
    expect(Value.Check(Healthcheck, newer)).toBe(false);
    const shim = { name: "dstack-gateway", version: "1", status: "installed" };
    expect(Value.Check(ComponentsView, { components: [shim] })).toBe(true);
    expect(Value.Check(Components, { components: [shim] })).toBe(false);
  });

  it("keep what every shim sends required, and the closed enums (task statuses) closed", () => {
    expect(Value.Check(TaskInfoView, { id: "t1", status: "sleeping" })).toBe(false);
    const core = { id: "t1", status: "sleeping", termination_reason: "", termination_message: "" };
    expect(Value.Check(TaskInfoView, core)).toBe(false);
    expect(Value.Check(HealthcheckView, { service: "dstack-shim" })).toBe(false);
    expect(Value.Check(HealthcheckView, { ...health, engine: { kind: "docker" } })).toBe(false);
    expect(Value.Check(HealthcheckView, { ...health, build: { commit: "abc" } })).toBe(false);
    // What the client reads without caring how it was built: only build_id is required.
    expect(Value.Check(HealthcheckView, { ...health, build: { build_id: "b" } })).toBe(true);
    expect(Value.Check(TaskListView, { tasks: [{ id: "t1" }] })).toBe(false);
  });
});

describe("tolerant and open", () => {
  it("leave the server's JSON schema as written (the OpenAPI document)", () => {
    const strict = Type.Union([Type.Literal("a"), Type.Literal("b")], { description: "d" });
    expect(JSON.stringify(open(strict))).toBe(JSON.stringify(strict));
    const schema = Type.Object({ x: open(strict), y: Type.Integer() });
    const before = JSON.stringify(schema);
    tolerant(schema, ["y"]);
    expect(JSON.stringify(schema)).toBe(before);
  });

  it("refuse a required path the schema does not have, when the view is built", () => {
    const schema = Type.Object({ engine: Type.Object({ status: Type.String() }) });
    expect(() => tolerant(schema, ["engine.state"])).toThrow("no such field: engine.state");
    expect(() => tolerant(schema, ["engine.status"])).not.toThrow();
  });
});
