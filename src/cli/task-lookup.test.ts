import { describe, expect, it } from "vitest";
import { ShimHttpError, type ShimTaskInfo } from "../control/shim-client.js";
import { resolveTask } from "./task-lookup.js";

const info = (id: string, name: string): ShimTaskInfo => ({
  id,
  name,
  status: "running",
  termination_reason: "",
  termination_message: "",
});

function fakeClient(tasks: readonly ShimTaskInfo[]) {
  const reads: string[] = [];
  return {
    reads,
    listTasks: () => Promise.resolve(tasks.map((t) => ({ id: t.id, status: t.status }))),
    getTask: (id: string) => {
      reads.push(id);
      const task = tasks.find((t) => t.id === id);
      return task
        ? Promise.resolve(task)
        : Promise.reject(new ShimHttpError(404, "Not Found", `/api/tasks/${id}`));
    },
  };
}

const TASKS = [
  info("c2dba460-aaaa", "train"),
  info("c2dba461-bbbb", "eval"),
  info("9f00aaaa-cccc", "c2dba460"),
  info("77aa0000-dddd", "twin"),
  info("77bb0000-eeee", "twin"),
];

describe("resolveTask", () => {
  it("takes an exact id with a single read", async () => {
    const client = fakeClient(TASKS);
    expect((await resolveTask(client, "c2dba461-bbbb")).name).toBe("eval");
    expect(client.reads).toEqual(["c2dba461-bbbb"]);
  });

  it("takes an exact name before an id prefix, then a unique prefix", async () => {
    expect((await resolveTask(fakeClient(TASKS), "train")).id).toBe("c2dba460-aaaa");
    // "c2dba460" is both a task's name and a prefix of another's id: the name wins, as in docker.
    expect((await resolveTask(fakeClient(TASKS), "c2dba460")).id).toBe("9f00aaaa-cccc");
    expect((await resolveTask(fakeClient(TASKS), "c2dba461")).id).toBe("c2dba461-bbbb");
    expect((await resolveTask(fakeClient(TASKS), "9f")).id).toBe("9f00aaaa-cccc");
  });

  it("refuses an ambiguous prefix or name, listing the candidates", async () => {
    await expect(resolveTask(fakeClient(TASKS), "c2dba")).rejects.toThrow(
      "id prefix c2dba matches 2 tasks: c2dba460-aaaa (train), c2dba461-bbbb (eval); give more of the id",
    );
    await expect(resolveTask(fakeClient(TASKS), "twin")).rejects.toThrow(
      /^name twin matches 2 tasks: 77aa0000-dddd/,
    );
  });

  it("names what it did not find", async () => {
    await expect(resolveTask(fakeClient(TASKS), "nope")).rejects.toThrow(
      "no such task: nope (see taskshim tasks ls)",
    );
    await expect(resolveTask(fakeClient(TASKS), "")).rejects.toThrow("a task id is empty");
  });
});
