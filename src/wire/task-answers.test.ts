import { describe, expect, it } from "vitest";
import { newTask, type Task } from "../tasks/task.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import { taskEvent, taskInfo } from "./task-answers.js";

const { config } = parseTaskConfig({ id: "wire-1", name: "job", image_name: "busybox:1.36" });

describe("taskInfo: what the Task leaves out is dstack's empty value on the wire", () => {
  it("shows a task with no container yet as container_id '', ports, pull progress and exit code null", () => {
    expect(taskInfo(newTask(config))).toMatchObject({
      container_id: "",
      ports: null,
      image_pull_progress: null,
      exit_code: null,
      gpus_ids: null,
    });
  });

  it("shows what is known as it is", () => {
    const progress = { downloaded_bytes: 1, extracted_bytes: 1, total_bytes: 2, is_total_bytes_final: true };
    const task: Task = {
      ...newTask(config),
      status: "terminated",
      terminationReason: "container_exited_with_error",
      containerId: "c0ffee",
      ports: [],
      pullProgress: progress,
      exitCode: 3,
    };
    expect(taskInfo(task)).toMatchObject({
      container_id: "c0ffee",
      ports: [],
      image_pull_progress: progress,
      exit_code: 3,
    });
    expect(taskEvent({ kind: "present", task })).toMatchObject({ exit_code: 3 });
  });

  it("shows an exit code that can never be known as null, like one not read yet", () => {
    const terminated: Task = {
      ...newTask(config),
      status: "terminated",
      terminationReason: "executor_error",
    };
    expect(taskInfo({ ...terminated, exitCode: null }).exit_code).toBeNull();
    expect(taskInfo(terminated).exit_code).toBeNull();
    expect(taskEvent({ kind: "present", task: terminated })).toMatchObject({ exit_code: null });
  });

  it("R12 hides a terminate's intent while the task is running (its container stopping), as dstack-shim shows it", () => {
    const stopping: Task = {
      ...newTask(config),
      status: "running",
      terminationReason: "terminated_by_user",
      terminationMessage: "bye",
      containerId: "c0ffee",
    };
    expect(taskInfo(stopping)).toMatchObject({
      status: "running",
      termination_reason: "",
      termination_message: "",
    });
    expect(taskEvent({ kind: "present", task: stopping })).not.toHaveProperty("termination_reason");
    expect(taskInfo({ ...stopping, status: "terminated" })).toMatchObject({
      termination_reason: "terminated_by_user",
      termination_message: "bye",
    });
  });
});
