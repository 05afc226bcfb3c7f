import { describe, expect, it } from "vitest";
import type { CleanupEvidence } from "../exec/cleanup-evidence.js";
import { OperationBound } from "../exec/operation-bound.js";
import {
  CommandLaunchError,
  CommandStdinError,
  CommandWaitCleanupError,
  type BoundedOutcome,
  type CommandRequest,
  type CommandRunner,
} from "../exec/run-bounded.js";
import { describeTarget, removeContainerViaCli } from "./cli-removal.js";
import { RemovalUnconfirmedError } from "./docker-errors.js";

type Answer = BoundedOutcome | Error;

/** A CommandRunner that answers each call with the next scripted outcome and records the argv. */
class ScriptedCommands implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  constructor(private readonly answers: Answer[]) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const next = this.answers.length > 1 ? this.answers.shift() : this.answers[0];
    if (next instanceof Error) return Promise.reject(next);
    return Promise.resolve(next as BoundedOutcome);
  }
  /** "rm" or "inspect", per call: which branch of the removal ran. */
  steps(): string[] {
    return this.calls.map((c) => (c.argv.join(" ").includes("inspect") ? "inspect" : "rm"));
  }
}

const exited = (code: number, stderr = "", stdout = ""): BoundedOutcome => ({
  kind: "exited",
  code,
  signal: null,
  stdout: Buffer.from(stdout),
  stderr: Buffer.from(stderr),
});

const evidence: CleanupEvidence = {
  trigger: "deadline",
  elapsed_ms: 3,
  reap_grace_ms: 5000,
  io_drain_grace_ms: 5000,
  kill_attempted: true,
  verified: true,
  error: null,
};
const expired: BoundedOutcome = {
  kind: "expired",
  kill: { ok: true },
  operationElapsedMs: 30_000,
  cleanup: evidence,
};
const IN_PROGRESS = "Error response from daemon: removal of container c1 is already in progress";
const NO_SUCH = "Error response from daemon: No such container: c1";

async function reasonOf(promise: Promise<unknown>): Promise<RemovalUnconfirmedError["reason"]> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(RemovalUnconfirmedError);
  return (error as RemovalUnconfirmedError).reason;
}

describe("removeContainerViaCli: the rm answer", () => {
  it("confirms a successful removal as removed, with one rm and no inspect", async () => {
    const commands = new ScriptedCommands([exited(0, "", "c1")]);
    expect(await removeContainerViaCli(commands, "c1")).toBe("removed");
    expect(commands.calls[0]?.argv).toEqual(["docker", "rm", "--force", "--volumes", "c1"]);
    expect(commands.calls[0]?.interruptible).toBe(false);
    expect(commands.steps()).toEqual(["rm"]);
  });

  it("confirms 'No such container' as already absent, without polling", async () => {
    const commands = new ScriptedCommands([exited(1, NO_SUCH)]);
    expect(await removeContainerViaCli(commands, "c1")).toBe("already-absent");
    expect(commands.steps()).toEqual(["rm"]);
  });

  it("reports any other exit with its status and stderr, without polling", async () => {
    const commands = new ScriptedCommands([exited(1, "Error response from daemon: driver failed")]);
    expect(await reasonOf(removeContainerViaCli(commands, "c1"))).toEqual({
      kind: "exit",
      code: 1,
      stderr: "Error response from daemon: driver failed",
    });
    expect(commands.steps()).toEqual(["rm"]);
  });

  it("carries the client's cleanup evidence when the docker client hits the deadline", async () => {
    const commands = new ScriptedCommands([expired]);
    expect(await reasonOf(removeContainerViaCli(commands, "c1"))).toEqual({
      kind: "deadline",
      elapsedMs: 30_000,
      cleanup: evidence,
    });
  });

  it("types a local launch failure as launch, and an ssh one as ssh naming the target", async () => {
    const local = new ScriptedCommands([new CommandLaunchError("cannot start docker: ENOENT")]);
    expect(await reasonOf(removeContainerViaCli(local, "c1"))).toEqual({
      kind: "launch",
      detail: "cannot start docker: ENOENT",
    });
    const remote = new ScriptedCommands([new CommandLaunchError("cannot start ssh: ENOENT")]);
    expect(
      await reasonOf(removeContainerViaCli(remote, "c1", { kind: "ssh", host: "gpu-7", user: "u", port: 2 })),
    ).toEqual({ kind: "ssh", detail: "failed to launch SSH for u@gpu-7:2: cannot start ssh: ENOENT" });
  });

  it("types a wait failure as wait_cleanup with the client's cleanup evidence", async () => {
    const waitEvidence = { ...evidence, trigger: "wait_failure" as const };
    const commands = new ScriptedCommands([new CommandWaitCleanupError("waitpid failed", 120, waitEvidence)]);
    expect(await reasonOf(removeContainerViaCli(commands, "c1"))).toEqual({
      kind: "wait_cleanup",
      detail: "waitpid failed",
      elapsedMs: 120,
      cleanup: waitEvidence,
    });
  });

  it("types a stdin or read failure as wait", async () => {
    const commands = new ScriptedCommands([new CommandStdinError("EPIPE")]);
    expect(await reasonOf(removeContainerViaCli(commands, "c1"))).toEqual({ kind: "wait", detail: "EPIPE" });
  });

  it("types an interrupted client as wait", async () => {
    const commands = new ScriptedCommands([
      { kind: "interrupted", kill: { ok: true }, operationElapsedMs: 5, cleanup: evidence },
    ]);
    expect(await reasonOf(removeContainerViaCli(commands, "c1"))).toEqual({
      kind: "wait",
      detail: "container cleanup was interrupted",
    });
  });
});

describe("removeContainerViaCli: a removal already in progress", () => {
  it("polls inspect until 'No such container' and confirms already absent", async () => {
    const commands = new ScriptedCommands([exited(1, IN_PROGRESS), exited(0, "", "abc"), exited(1, NO_SUCH)]);
    expect(await removeContainerViaCli(commands, "c1")).toBe("already-absent");
    expect(commands.steps()).toEqual(["rm", "inspect", "inspect"]);
    expect(commands.calls[1]?.argv).toEqual(["docker", "container", "inspect", "--format", "{{.Id}}", "c1"]);
  });

  it("keeps polling through every other answer: a launch error, ssh's 255, a timed-out probe", async () => {
    const commands = new ScriptedCommands([
      exited(1, IN_PROGRESS),
      new CommandLaunchError("cannot start ssh"),
      exited(255, "ssh: connect to host gpu-7 port 22: Connection refused"),
      expired,
      exited(1, "Error response from daemon: i/o timeout"),
      exited(1, NO_SUCH),
    ]);
    const started = Date.now();
    expect(await removeContainerViaCli(commands, "c1", { kind: "ssh", host: "gpu-7" })).toBe(
      "already-absent",
    );
    expect(commands.steps()).toEqual(["rm", "inspect", "inspect", "inspect", "inspect", "inspect"]);
    // Four waits of 250 ms between five probes.
    expect(Date.now() - started).toBeGreaterThanOrEqual(4 * 250 - 20);
  });

  it("ends unconfirmed at the deadline, with the last killed probe's evidence", async () => {
    const commands = new ScriptedCommands([exited(1, IN_PROGRESS), expired, exited(0, "", "abc")]);
    const started = Date.now();
    const reason = await reasonOf(
      removeContainerViaCli(commands, "c1", { kind: "local" }, OperationBound.within(700)),
    );
    const took = Date.now() - started;
    expect(reason).toMatchObject({ kind: "deadline", cleanup: evidence });
    expect(took).toBeGreaterThanOrEqual(690);
    expect(took).toBeLessThan(1_700);
    // One inspect per 250 ms: at most 4 in 700 ms.
    const inspects = commands.steps().filter((s) => s === "inspect").length;
    expect(inspects).toBeGreaterThanOrEqual(2);
    expect(inspects).toBeLessThanOrEqual(4);
  });
});

describe("the docker CLI over SSH", () => {
  it("runs docker on the remote machine with the container name shell-quoted", async () => {
    const commands = new ScriptedCommands([exited(0)]);
    await removeContainerViaCli(commands, "job'; rm -rf /", {
      kind: "ssh",
      host: "gpu-7",
      user: "ubuntu",
      port: 2222,
      options: ["StrictHostKeyChecking=accept-new"],
    });
    const argv = commands.calls[0]?.argv ?? [];
    expect(argv.slice(0, -1)).toEqual([
      "ssh",
      "-o",
      "StrictHostKeyChecking=accept-new",
      "-o",
      "BatchMode=yes",
      "-o",
      "ConnectTimeout=10",
      "-o",
      "ServerAliveInterval=5",
      "-o",
      "ServerAliveCountMax=2",
      "-p",
      "2222",
      "--",
      "ubuntu@gpu-7",
    ]);
    expect(argv.at(-1)).toBe(`'docker' 'rm' '--force' '--volumes' 'job'\\''; rm -rf /'`);
  });

  it("adds an identity file when given, and names the target as written", async () => {
    const commands = new ScriptedCommands([exited(0)]);
    await removeContainerViaCli(commands, "c1", { kind: "ssh", host: "h", identityFile: "/k" });
    expect(commands.calls[0]?.argv.join(" ")).toContain("-i /k -- h ");
    expect(describeTarget({ kind: "ssh", host: "h" })).toBe("h");
    expect(describeTarget({ kind: "local" })).toBe("local");
  });
});
