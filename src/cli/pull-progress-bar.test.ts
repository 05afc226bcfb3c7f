import { describe, expect, it } from "vitest";
import type { ShimTaskInfo } from "../control/shim-client.js";
import type { TaskStatus } from "../tasks/task-status.js";
import {
  barLine,
  describePull,
  lineWidth,
  progressBar,
  pullFraction,
  SubmitProgressView,
} from "./pull-progress-bar.js";

const MB = 1_000_000;

function task(status: TaskStatus, progress: ShimTaskInfo["image_pull_progress"] = null): ShimTaskInfo {
  return {
    id: "t1",
    status,
    termination_reason: "",
    termination_message: "",
    image_pull_progress: progress,
  };
}

const pull = (downloaded: number, extracted: number, total: number, final = true) => ({
  downloaded_bytes: downloaded,
  extracted_bytes: extracted,
  total_bytes: total,
  is_total_bytes_final: final,
});

class Output {
  text = "";
  constructor(
    readonly isTTY: boolean,
    readonly columns = 100,
  ) {}
  write(chunk: string): void {
    this.text += chunk;
  }
}

describe("progress text", () => {
  it("draws a bar of the given width", () => {
    expect(progressBar(0, 12)).toBe("[----------]");
    expect(progressBar(0.5, 12)).toBe("[#####-----]");
    expect(progressBar(1, 12)).toBe("[##########]");
    expect(progressBar(7, 12)).toBe("[##########]");
    expect(progressBar(Number.NaN, 12)).toBe("[----------]");
  });

  it("describes downloading, then extracting, and marks a total that may grow", () => {
    expect(describePull(null)).toBe("pulling (waiting for layer sizes)");
    expect(describePull(pull(12_300_000, 0, 45_600_000))).toBe("pulling 12.3 MB / 45.6 MB");
    expect(describePull(pull(12_300_000, 0, 45_600_000, false))).toBe("pulling 12.3 MB / 45.6 MB+");
    expect(describePull(pull(45_600_000, 10 * MB, 45_600_000))).toBe("extracting 10.0 MB / 45.6 MB");
  });

  it("weighs download and extraction equally", () => {
    expect(pullFraction(null)).toBe(0);
    expect(pullFraction(pull(0, 0, 0))).toBe(0);
    expect(pullFraction(pull(10, 0, 10))).toBe(0.5);
    expect(pullFraction(pull(10, 10, 10))).toBe(1);
  });
});

describe("SubmitProgressView, plain output", () => {
  it("prints status lines and at most one pull line per interval, then the pulled size", () => {
    const out = new Output(false);
    let now = 0;
    const view = new SubmitProgressView(out, () => now, 1_000);
    view.update(task("pending"));
    view.update(task("preparing"));
    view.update(task("pulling", null));
    now = 300;
    view.update(task("pulling", pull(1 * MB, 0, 4 * MB)));
    now = 1_000;
    view.update(task("pulling", pull(2 * MB, 0, 4 * MB)));
    now = 1_500;
    view.update(task("pulling", pull(3 * MB, 0, 4 * MB)));
    now = 2_100;
    view.update(task("pulling", pull(4 * MB, 1 * MB, 4 * MB)));
    view.update(task("creating", pull(4 * MB, 4 * MB, 4 * MB)));
    view.update(task("running", pull(4 * MB, 4 * MB, 4 * MB)));
    view.end(task("running", pull(4 * MB, 4 * MB, 4 * MB)));
    expect(out.text.split("\n")).toEqual([
      "preparing",
      "pulling (waiting for layer sizes)",
      "pulling 2.0 MB / 4.0 MB",
      "extracting 1.0 MB / 4.0 MB",
      "pulled 4.0 MB",
      "creating",
      "",
    ]);
    expect(out.text).not.toContain("\r");
  });

  it("still reports the pull when the task was first seen past it", () => {
    const out = new Output(false);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("running", pull(5 * MB, 5 * MB, 5 * MB)));
    view.end(task("running", pull(5 * MB, 5 * MB, 5 * MB)));
    expect(out.text).toBe("pulled 5.0 MB\n");
  });

  it("shows where a failed pull stopped instead of 'pulled'", () => {
    const out = new Output(false);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("pulling", pull(1 * MB, 0, 4 * MB)));
    view.update(task("terminated", pull(1 * MB, 0, 4 * MB)));
    view.end(task("terminated", pull(1 * MB, 0, 4 * MB)));
    expect(out.text).toBe("pulling 1.0 MB / 4.0 MB\npulling 1.0 MB / 4.0 MB\n");
  });

  it("prints nothing about a pull that never reported a layer (image already present)", () => {
    const out = new Output(false);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("creating"));
    view.update(task("running"));
    view.end(task("running"));
    expect(out.text).toBe("creating\n");
  });
});

describe("SubmitProgressView, terminal", () => {
  it("redraws one bar line in place, always of the same width, and replaces it with the final size", () => {
    const out = new Output(true, 100);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("pulling", null));
    view.update(task("pulling", pull(1 * MB, 0, 4 * MB)));
    view.update(task("pulling", pull(4 * MB, 1 * MB, 4 * MB)));
    view.update(task("pulling", pull(4 * MB, 4 * MB, 4 * MB)));
    view.update(task("creating", pull(4 * MB, 4 * MB, 4 * MB)));
    view.end(task("running", pull(4 * MB, 4 * MB, 4 * MB)));
    const frames = out.text.split("\r\x1b[K");
    expect(frames[1]).toMatch(/^\[-+\] {3}0% pulling \(waiting for layer sizes\) *$/);
    expect(frames[2]).toMatch(/^\[#+-+\] {2}12% pulling 1\.0 MB \/ 4\.0 MB *$/);
    expect(frames[3]).toMatch(/^\[#+-+\] {2}62% extracting 1\.0 MB \/ 4\.0 MB *$/);
    expect(frames[4]).toMatch(/^\[#+\] 100% pulling 4\.0 MB \/ 4\.0 MB *$/);
    expect(new Set(frames.slice(1, 5).map((f) => f.length))).toEqual(new Set([lineWidth(100)]));
    expect(frames[5]).toBe("pulled 4.0 MB\ncreating\n");
  });

  it("clears a bar whose pull failed or was interrupted, leaving nothing of it on screen", () => {
    const out = new Output(true, 100);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("pulling", null));
    view.update(task("terminated", null));
    view.end(task("terminated", null));
    expect(out.text.endsWith("\r\x1b[K")).toBe(true);
    const interrupted = new Output(true, 100);
    const other = new SubmitProgressView(interrupted, () => 0);
    other.update(task("pulling", pull(1 * MB, 0, 4 * MB)));
    other.end(undefined);
    expect(interrupted.text.endsWith("\r\x1b[K")).toBe(true);
  });

  it("keeps the width on a narrow terminal, the bar left out", () => {
    const out = new Output(true, 30);
    const view = new SubmitProgressView(out, () => 0);
    view.update(task("pulling", pull(1 * MB, 0, 4 * MB)));
    expect(out.text).toBe(`\r\x1b[K${" 12% pulling 1.0 MB / 4.0 MB".padEnd(lineWidth(30))}`);
    expect(barLine(pull(1 * MB, 0, 4 * MB), 30)).toHaveLength(29);
  });
});
