import { describe, expect, it } from "vitest";
import { fence } from "../control/fence.js";
import type { BoundedOutcome, CommandRequest, CommandRunner } from "../exec/run-bounded.js";
import {
  fenceRequestOf,
  FenceUsageError,
  formatFenceReport,
  parseDeadline,
  parseSshTarget,
  type FenceFlags,
} from "./fence.js";

const flags = (over: Partial<FenceFlags>): FenceFlags => ({
  sshOption: [],
  task: [],
  label: [],
  deadline: "30s",
  ...over,
});

describe("fence command line", () => {
  it("reads a deadline in ms, s or m, a bare number as seconds", () => {
    expect(parseDeadline("30s")).toBe(30_000);
    expect(parseDeadline("500ms")).toBe(500);
    expect(parseDeadline("2m")).toBe(120_000);
    expect(parseDeadline("5")).toBe(5_000);
    expect(parseDeadline("1.5s")).toBe(1_500);
    for (const bad of ["", "abc", "0s", "-1s", "10h", "2h"])
      expect(() => parseDeadline(bad)).toThrow(FenceUsageError);
  });

  it("reads [USER@]HOST[:PORT], and refuses what ssh would take for an option", () => {
    expect(parseSshTarget("gpu-7")).toEqual({ host: "gpu-7" });
    expect(parseSshTarget("ubuntu@gpu-7:2222")).toEqual({ host: "gpu-7", user: "ubuntu", port: 2222 });
    expect(parseSshTarget("root@[::1]:22")).toEqual({ host: "::1", user: "root", port: 22 });
    for (const bad of ["-oProxyCommand=x", "u@-h", "h:0", "h:70000", "a b", "", "h:"]) {
      expect(() => parseSshTarget(bad)).toThrow(FenceUsageError);
    }
  });

  it("refuses a command line it cannot use, saying why", () => {
    const cases: [Partial<FenceFlags>, RegExp][] = [
      [{ all: true }, /--shim URL, --ssh/],
      [{ local: true }, /--all, or --task ID/],
      [{ local: true, ssh: "h", all: true }, /exclude each other/],
      [{ local: true, all: true, task: ["a"] }, /--all and --task/],
      [{ local: true, all: true, identity: "/k" }, /need --ssh/],
      [{ local: true, all: true, sshOption: ["X=y"] }, /need --ssh/],
      [{ local: true, all: true, label: ["novalue"] }, /invalid --label/],
      [{ shim: "ftp://h", all: true }, /use http/],
      [{ shim: "not a url", all: true }, /invalid --shim/],
      [{ local: true, all: true, deadline: "never" }, /invalid --deadline/],
      [{ local: true, task: [" "] }, /needs a task id/],
    ];
    for (const [over, message] of cases) expect(() => fenceRequestOf(flags(over))).toThrow(message);
  });

  it("builds the request: --shim with an --ssh fallback, deduplicated tasks, the 30 s default", () => {
    expect(
      fenceRequestOf(
        flags({
          shim: "http://10.0.0.7:10998/x",
          ssh: "ubuntu@10.0.0.7",
          identity: "/k",
          sshOption: ["StrictHostKeyChecking=yes"],
          task: ["a", "b", "a"],
        }),
      ),
    ).toEqual({
      shimUrl: "http://10.0.0.7:10998",
      cli: {
        kind: "ssh",
        host: "10.0.0.7",
        user: "ubuntu",
        identityFile: "/k",
        options: ["StrictHostKeyChecking=yes"],
      },
      selection: { kind: "tasks", ids: ["a", "b"] },
      deadlineMs: 30_000,
      labels: [],
    });
  });
});

/** A CommandRunner that answers `docker container ls` with a listing and every other call with `rm`'s answer. */
class HostCommands implements CommandRunner {
  readonly calls: string[][] = [];
  constructor(
    private readonly listing: string,
    private readonly rm: (argv: readonly string[]) => BoundedOutcome,
  ) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push([...request.argv]);
    if (request.argv.includes("ls")) {
      return Promise.resolve({
        kind: "exited",
        code: 0,
        signal: null,
        stdout: Buffer.from(this.listing),
        stderr: Buffer.alloc(0),
      });
    }
    return Promise.resolve(this.rm(request.argv));
  }
}

const exited = (code: number, stderr = ""): BoundedOutcome => ({
  kind: "exited",
  code,
  signal: null,
  stdout: Buffer.alloc(0),
  stderr: Buffer.from(stderr),
});

describe("fence over the docker CLI", () => {
  const listing = "id1\tjob-a-1\ttask-a\nid2\tjob-b-2\ttask-b\n";

  it("lists by the task label only, removes by id, and reports each container", async () => {
    const commands = new HostCommands(listing, (argv) =>
      argv.includes("id2") ? exited(1, "Error response from daemon: driver failed") : exited(0),
    );
    const report = await fence(commands, {
      cli: { kind: "local" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
      labels: ["owner=me"],
    });
    expect(commands.calls[0]).toEqual([
      "docker",
      "container",
      "ls",
      "--all",
      "--no-trunc",
      "--filter",
      "label=ai.dstack.shim.is-task=true",
      "--filter",
      "label=owner=me",
      "--format",
      '{{.ID}}\t{{.Names}}\t{{.Label "ai.dstack.shim.task-id"}}',
    ]);
    expect(commands.calls.slice(1).map((argv) => argv.at(-1))).toEqual(["id1", "id2"]);
    expect(report.via).toBe("local");
    expect(report.confirmed).toBe(false);
    expect(report.results).toEqual([
      {
        container: "job-a-1",
        task_id: "task-a",
        outcome: "removed",
        reason: null,
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: "id1" },
      },
      {
        container: "job-b-2",
        task_id: "task-b",
        outcome: "unconfirmed",
        reason: "exit",
        evidence: {
          elapsed_ms: expect.any(Number) as number,
          container_id: "id2",
          detail: "exit status 1: Error response from daemon: driver failed",
          code: 1,
          stderr: "Error response from daemon: driver failed",
        },
      },
    ]);
    const table = formatFenceReport(report);
    expect(table.split("\n")[0]).toMatch(/^CONTAINER\s+TASK ID\s+OUTCOME\s+DETAIL$/);
    expect(table).toContain("NOT confirmed: 2 result(s) via local");
  });

  it("touches only the selected tasks' containers", async () => {
    const commands = new HostCommands(listing, () => exited(0));
    const report = await fence(commands, {
      cli: { kind: "local" },
      selection: { kind: "tasks", ids: ["task-b"] },
      deadlineMs: 5_000,
    });
    expect(commands.calls.slice(1).map((argv) => argv.at(-1))).toEqual(["id2"]);
    expect(report.confirmed).toBe(true);
    expect(report.results.map((r) => [r.container, r.outcome])).toEqual([["job-b-2", "removed"]]);
  });

  it("confirms nothing when the host cannot be listed", async () => {
    const commands: CommandRunner = {
      run: () =>
        Promise.resolve(exited(255, "Warning: banner\nssh: connect to host h port 22: Connection refused")),
    };
    const report = await fence(commands, {
      cli: { kind: "ssh", host: "h" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    expect(report).toEqual({ host: "h", via: "ssh", confirmed: false, results: [] });
  });
});
