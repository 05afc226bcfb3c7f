import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { OperationBound } from "./operation-bound.js";
import {
  BoundedCommandRunner,
  COMMAND_IO_DRAIN_GRACE_MS,
  COMMAND_REAP_GRACE_MS,
  CommandLaunchError,
  CommandStdinError,
  CommandWaitCleanupError,
  CommandWaitError,
  type BoundedOutcome,
  type SpawnFn,
} from "./run-bounded.js";

/**
 * The seed's bounded-command contract (`container.rs`, `run_with_bound`), test for test, with its
 * expectations and constants, plus one test per typed failure.
 */

function expectKind<K extends BoundedOutcome["kind"]>(
  outcome: BoundedOutcome,
  kind: K,
): Extract<BoundedOutcome, { kind: K }> {
  expect(outcome.kind).toBe(kind);
  return outcome as Extract<BoundedOutcome, { kind: K }>;
}

/** The live (non-zombie) members of a process group, read from /proc. */
function liveMembers(pgid: number): number[] {
  const members: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      // Fields after the comm: state, ppid, pgrp…
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(pgrp) === pgid && state !== "Z") members.push(Number(entry));
    } catch {
      // The process ended while we read.
    }
  }
  return members;
}

/**
 * Waits until no live member of the group is left. A SIGKILLed process closes its pipes a moment
 * before it becomes a zombie, so the group may still show it briefly after the drain.
 */
async function expectGroupGone(pgid: number | undefined): Promise<void> {
  expect(pgid).toBeGreaterThan(1);
  const until = Date.now() + 2_000;
  while (liveMembers(pgid ?? -1).length > 0 && Date.now() < until) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  expect(liveMembers(pgid ?? -1)).toEqual([]);
}

/** A spawn that records every child it starts, so a test can check what is left of its group. */
function recordingSpawn(then?: (child: ChildProcess) => void): { spawn: SpawnFn; pids: number[] } {
  const pids: number[] = [];
  return {
    pids,
    spawn: (program, args, options) => {
      const child = spawn(program, args, options);
      if (child.pid !== undefined) pids.push(child.pid);
      then?.(child);
      return child;
    },
  };
}

describe("the seed's constants", () => {
  // The removal deadline (30 s) is pinned beside the removal, in docker/dockerode-removal.test.ts.
  it("reap grace 5,000 ms, drain grace 5,000 ms", () => {
    expect(COMMAND_REAP_GRACE_MS).toBe(5_000);
    expect(COMMAND_IO_DRAIN_GRACE_MS).toBe(5_000);
  });
});

describe("the seed's tests, ported", () => {
  it("unbounded command wait terminates when the process exits", async () => {
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", "exit 0"],
      bound: OperationBound.unbounded(),
    });
    expect(expectKind(outcome, "exited").code).toBe(0);
  });

  it("pending interruption terminates an unbounded command", async () => {
    const controller = new AbortController();
    controller.abort();
    const recorded = recordingSpawn();
    const outcome = await new BoundedCommandRunner(controller.signal, { spawn: recorded.spawn }).run({
      argv: ["sh", "-c", "sleep 60"],
      bound: OperationBound.unbounded(),
    });
    const interrupted = expectKind(outcome, "interrupted");
    expect(interrupted.kill).toEqual({ ok: true });
    expect(interrupted.operationElapsedMs).toBeLessThan(1_000);
    expect(interrupted.cleanup.verified).toBe(true);
    expect(interrupted.cleanup.trigger).toBe("interruption");
    expect(interrupted.cleanup.kill_attempted).toBe(true);
    expect(interrupted.cleanup.reap_grace_ms).toBe(5_000);
    expect(interrupted.cleanup.io_drain_grace_ms).toBe(5_000);
    expect(interrupted.cleanup.error).toBeNull();
    await expectGroupGone(recorded.pids[0]);
  });

  it("blocked stdin write cannot outlive the owner bound", async () => {
    const started = Date.now();
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", "while :; do :; done"],
      stdin: Buffer.alloc(1024 * 1024, "x"),
      bound: OperationBound.within(50),
    });
    const expired = expectKind(outcome, "expired");
    expect(expired.kill).toEqual({ ok: true });
    expect(expired.cleanup).toMatchObject({ trigger: "deadline", verified: true, error: null });
    // Killed at the bound and cleaned up well within the graces.
    expect(Date.now() - started).toBeLessThan(3_000);
  });

  it("inherited output pipe cannot outlive the owner bound (a grandchild holding the pipe)", async () => {
    const recorded = recordingSpawn();
    const started = Date.now();
    const outcome = await new BoundedCommandRunner(undefined, { spawn: recorded.spawn }).run({
      argv: ["sh", "-c", "sleep 60 & exit 0"],
      bound: OperationBound.within(50),
    });
    const took = Date.now() - started;
    const expired = expectKind(outcome, "expired");
    expect(expired.kill).toEqual({ ok: true });
    // Elapsed is read when the bound fires, before the cleanup.
    expect(expired.operationElapsedMs).toBeGreaterThanOrEqual(50);
    expect(expired.operationElapsedMs).toBeLessThanOrEqual(took);
    expect(expired.cleanup).toMatchObject({
      trigger: "deadline",
      kill_attempted: true,
      verified: true,
      error: null,
      reap_grace_ms: 5_000,
      io_drain_grace_ms: 5_000,
    });
    // Not the 5 s drain grace of a wait that ignored the bound after the exit.
    expect(took).toBeLessThan(3_000);
    await expectGroupGone(recorded.pids[0]);
  });

  it("drains stdout and stderr concurrently, so a child past the pipe capacity cannot deadlock", async () => {
    const size = 1024 * 1024;
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", `head -c ${size} /dev/zero >&2; head -c ${size} /dev/zero`],
      bound: OperationBound.within(5_000),
    });
    const exited = expectKind(outcome, "exited");
    expect(exited.code).toBe(0);
    expect(exited.stderr.length).toBe(size);
    expect(exited.stdout.length).toBe(size);
  });

  it("rejects an empty argv as a launch error", async () => {
    const error = await new BoundedCommandRunner().run({ argv: [] }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandLaunchError);
    expect((error as Error).message).toBe("external command argv is empty");
  });

  it("returns expired, kill ok, no cleanup and nothing spawned when the bound has already expired", async () => {
    const recorded = recordingSpawn();
    const bound = OperationBound.within(0);
    const outcome = await new BoundedCommandRunner(undefined, { spawn: recorded.spawn }).run({
      argv: ["sleep", "60"],
      bound,
    });
    expect(outcome).toEqual({
      kind: "expired",
      kill: { ok: true },
      operationElapsedMs: expect.any(Number) as number,
      cleanup: null,
    });
    expect(recorded.pids).toEqual([]);
  });
});

describe("one bound for the whole operation, interruption at every stage", () => {
  it("an interruption while a grandchild holds the pipe after the exit ends the command at once", async () => {
    const controller = new AbortController();
    const recorded = recordingSpawn();
    setTimeout(() => controller.abort(), 200);
    const started = Date.now();
    const outcome = await new BoundedCommandRunner(controller.signal, { spawn: recorded.spawn }).run({
      argv: ["sh", "-c", "sleep 60 & exit 0"],
    });
    const interrupted = expectKind(outcome, "interrupted");
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(interrupted.kill).toEqual({ ok: true });
    expect(interrupted.cleanup).toMatchObject({ trigger: "interruption", verified: true });
    await expectGroupGone(recorded.pids[0]);
  });

  it("a grandchild that left the group keeps the pipe: the cleanup says so and kill is not ok", async () => {
    // setsid puts the grandchild in its own session, out of reach of the group kill: a real
    // cleanup failure. Small graces keep the test short.
    const runner = new BoundedCommandRunner(undefined, { reapMs: 1_000, drainMs: 300 });
    const dir = await mkdtemp(join(tmpdir(), "escaped-"));
    const pidFile = join(dir, "pid");
    try {
      const outcome = await runner.run({
        argv: ["sh", "-c", `setsid sleep 60 & echo $! > '${pidFile}'; exec sleep 60`],
        bound: OperationBound.within(300),
      });
      const expired = expectKind(outcome, "expired");
      expect(expired.kill).toEqual({
        ok: false,
        error: "command I/O did not drain within 300 ms after termination",
      });
      expect(expired.cleanup).toMatchObject({
        trigger: "deadline",
        verified: false,
        error: "command I/O did not drain within 300 ms after termination",
        io_drain_grace_ms: 300,
      });
    } finally {
      const escaped = Number(await readFile(pidFile, "utf8").catch(() => "0"));
      if (escaped > 1) process.kill(escaped, "SIGKILL");
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("a child the OS does not reap within the reap grace leaves unverified evidence", async () => {
    // Fault a real kernel will not produce on demand (a process stuck in D state): the exit
    // event is withheld from the runner, so the reap grace runs out.
    const recorded = recordingSpawn((child) => {
      const emit = child.emit.bind(child);
      child.emit = (event: string | symbol, ...args: unknown[]): boolean =>
        event === "exit" ? false : emit(event, ...args);
    });
    const runner = new BoundedCommandRunner(undefined, { reapMs: 200, drainMs: 200, spawn: recorded.spawn });
    const outcome = await runner.run({ argv: ["sleep", "60"], bound: OperationBound.within(100) });
    const expired = expectKind(outcome, "expired");
    expect(expired.kill).toEqual({ ok: false, error: "command child did not reap within 200 ms" });
    expect(expired.cleanup).toMatchObject({ verified: false, reap_grace_ms: 200 });
    await expectGroupGone(recorded.pids[0]);
  });
});

describe("typed failures", () => {
  it("a stdin write the child refuses (EPIPE) ends as CommandStdinError", async () => {
    const error = await new BoundedCommandRunner()
      .run({
        argv: ["sh", "-c", "exit 4"],
        stdin: Buffer.alloc(4 * 1024 * 1024, "a"),
        bound: OperationBound.within(5_000),
      })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandStdinError);
    expect(((error as Error).cause as NodeJS.ErrnoException).code).toBe("EPIPE");
    expect((error as Error).name).toBe("CommandStdinError");
    expect((error as Error).message).toMatch(/^writing stdin of sh failed: .*EPIPE/);
  });

  it("a failed wait kills the group and ends as CommandWaitCleanupError with its evidence", async () => {
    // Fault a real kernel will not produce on demand: Node reports it failed to wait for the
    // child (an `error` event after a successful spawn).
    const recorded = recordingSpawn((child) => {
      setTimeout(() => child.emit("error", new Error("waitpid: ECHILD")), 100);
    });
    const error = await new BoundedCommandRunner(undefined, { spawn: recorded.spawn })
      .run({ argv: ["sh", "-c", "sleep 60 & sleep 60"], bound: OperationBound.within(10_000) })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandWaitCleanupError);
    const failed = error as CommandWaitCleanupError;
    expect(failed.name).toBe("CommandWaitCleanupError");
    expect(failed.message).toBe("waiting for sh failed: waitpid: ECHILD");
    expect((failed.cause as Error).message).toBe("waitpid: ECHILD");
    expect(failed.operationElapsedMs).toBeGreaterThanOrEqual(100);
    expect(failed.operationElapsedMs).toBeLessThan(2_000);
    expect(failed.cleanup).toMatchObject({
      trigger: "wait_failure",
      kill_attempted: true,
      verified: true,
      error: null,
      reap_grace_ms: 5_000,
      io_drain_grace_ms: 5_000,
    });
    await expectGroupGone(recorded.pids[0]);
  });

  it("a read error on the output ends as CommandWaitError, never as a clean exit", async () => {
    // Fault injected on our end of the pipe (a read error the kernel will not produce on demand).
    const recorded = recordingSpawn((child) => {
      setTimeout(() => child.stdout?.destroy(new Error("EIO: read failed")), 50);
    });
    const error = await new BoundedCommandRunner(undefined, { spawn: recorded.spawn })
      .run({ argv: ["sh", "-c", "sleep 0.3; exit 0"], bound: OperationBound.within(5_000) })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandWaitError);
    expect((error as Error).name).toBe("CommandWaitError");
    expect((error as Error).message).toBe("reading stdout of sh failed: EIO: read failed");
    expect(((error as Error).cause as Error).message).toBe("EIO: read failed");
  });

  it("a missing binary ends as CommandLaunchError", async () => {
    await expect(new BoundedCommandRunner().run({ argv: ["/nonexistent/taskshim-binary"] })).rejects.toThrow(
      CommandLaunchError,
    );
  });
});
