import { describe, expect, it } from "vitest";
import type { CleanupEvidence } from "../exec/cleanup-evidence.js";
import { OperationBound } from "../exec/operation-bound.js";
import {
  CommandLaunchError,
  type BoundedOutcome,
  type CommandRequest,
  type CommandRunner,
} from "../exec/run-bounded.js";
import { dockerGpuArgs, removeContainerViaCli, sshArgv } from "./cli-removal.js";
import { RemovalUnconfirmedError } from "./docker-errors.js";

/** A runner that answers each call with the next scripted outcome and records the argv. */
class ScriptedRunner implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  constructor(
    private readonly answers: (BoundedOutcome | Error | ((r: CommandRequest) => BoundedOutcome))[],
  ) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const next = this.answers.length > 1 ? this.answers.shift() : this.answers[0];
    if (next instanceof Error) return Promise.reject(next);
    if (typeof next === "function") return Promise.resolve(next(request));
    return Promise.resolve(next as BoundedOutcome);
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

async function reasonOf(promise: Promise<unknown>): Promise<RemovalUnconfirmedError["reason"]> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(RemovalUnconfirmedError);
    return (error as RemovalUnconfirmedError).reason;
  }
  throw new Error("expected the removal to be unconfirmed");
}

describe("removeContainerViaCli", () => {
  it("confirms a successful removal", async () => {
    const runner = new ScriptedRunner([exited(0, "", "c1")]);
    expect(await removeContainerViaCli(runner, "c1")).toBe("removed");
    expect(runner.calls[0]?.argv).toEqual(["docker", "rm", "--force", "--volumes", "c1"]);
    expect(runner.calls[0]?.interruptible).toBe(false);
  });

  it("confirms a container that is already absent", async () => {
    const runner = new ScriptedRunner([exited(1, "Error: No such container: c1")]);
    expect(await removeContainerViaCli(runner, "c1")).toBe("already-absent");
  });

  it("polls a removal already in progress until the container is gone", async () => {
    const runner = new ScriptedRunner([
      exited(1, "Error response from daemon: removal of container c1 is already in progress"),
      exited(0, "", "abc"),
      exited(1, "Error: No such container: c1"),
    ]);
    expect(await removeContainerViaCli(runner, "c1")).toBe("removed");
    expect(runner.calls.map((c) => c.argv.slice(1, 3).join(" "))).toEqual([
      "rm --force",
      "container inspect",
      "container inspect",
    ]);
  });

  it("reports a removal in progress that never ends as unconfirmed at the deadline", async () => {
    const runner = new ScriptedRunner([
      exited(1, "Error response from daemon: removal of container c1 is already in progress"),
      exited(0, "", "abc"),
    ]);
    const started = Date.now();
    const reason = await reasonOf(
      removeContainerViaCli(runner, "c1", { kind: "local" }, OperationBound.within(600)),
    );
    expect(reason.kind).toBe("deadline");
    expect(Date.now() - started).toBeLessThan(1_500);
  });

  it("reports any other failure with its exit status and stderr", async () => {
    const runner = new ScriptedRunner([exited(1, "Error response from daemon: driver failed")]);
    expect(await reasonOf(removeContainerViaCli(runner, "c1"))).toEqual({
      kind: "exit-status",
      code: 1,
      stderr: "Error response from daemon: driver failed",
    });
  });

  it("reports a launch failure", async () => {
    const runner = new ScriptedRunner([new CommandLaunchError("cannot start docker: ENOENT")]);
    expect((await reasonOf(removeContainerViaCli(runner, "c1"))).kind).toBe("launch");
  });

  it("carries the client's cleanup evidence when the docker client hits the deadline", async () => {
    const runner = new ScriptedRunner([
      { kind: "expired", kill: { ok: true }, operationElapsedMs: 30_000, cleanup: evidence },
    ]);
    expect(await reasonOf(removeContainerViaCli(runner, "c1"))).toEqual({
      kind: "deadline",
      elapsedMs: 30_000,
      cleanup: evidence,
    });
  });

  it("reports ssh's own failure (exit 255) as an ssh reason", async () => {
    const runner = new ScriptedRunner([
      exited(255, "ssh: connect to host gpu-7 port 22: Connection refused"),
    ]);
    const reason = await reasonOf(removeContainerViaCli(runner, "c1", { kind: "ssh", host: "gpu-7" }));
    expect(reason).toEqual({ kind: "ssh", detail: "ssh: connect to host gpu-7 port 22: Connection refused" });
  });

  it("runs docker on the remote machine with the container name shell-quoted", async () => {
    const runner = new ScriptedRunner([exited(0)]);
    await removeContainerViaCli(runner, "job'; rm -rf /", {
      kind: "ssh",
      host: "gpu-7",
      user: "ubuntu",
      port: 2222,
    });
    const argv = runner.calls[0]?.argv ?? [];
    expect(argv.slice(0, -1)).toEqual([
      "ssh",
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
});

describe("sshArgv and dockerGpuArgs", () => {
  it("adds an identity file when given", () => {
    expect(sshArgv({ kind: "ssh", host: "h", identityFile: "/k" })).toContain("/k");
  });

  it("quotes a device list so docker does not split it on the comma", () => {
    expect(dockerGpuArgs("0,1")).toEqual(["--gpus", '"device=0,1"']);
    expect(dockerGpuArgs("3")).toEqual(["--gpus", '"device=3"']);
  });
});
