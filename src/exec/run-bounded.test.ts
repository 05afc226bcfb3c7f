import { rejected } from "../testing/thrown.js";
import { randomBytes } from "node:crypto";
import { getEventListeners } from "node:events";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { OperationBound } from "./operation-bound.js";
import {
  BoundedCommandRunner,
  COMMAND_OUTPUT_CAP_BYTES,
  CommandFailedError,
  CommandLaunchError,
  runChecked,
  type BoundedOutcome,
} from "./run-bounded.js";

/** Small graces keep the failure paths fast; they never shorten a successful run. */
const FAST = { reapMs: 1_000, drainMs: 300 };

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "run-bounded-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function expectKind<K extends BoundedOutcome["kind"]>(
  outcome: BoundedOutcome,
  kind: K,
): Extract<BoundedOutcome, { kind: K }> {
  expect(outcome.kind).toBe(kind);
  return outcome as Extract<BoundedOutcome, { kind: K }>;
}

function processState(pid: number): string | undefined {
  try {
    // The third field of /proc/<pid>/stat is the state letter; the comm field may hold spaces.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  } catch {
    return undefined;
  }
}

/**
 * Waits until `pid` is gone. A killed orphan is reparented to PID 1, which may reap it lazily;
 * a zombie is dead (it runs nothing and holds nothing), so it counts as gone too.
 */
async function expectGone(pid: number, timeoutMs = 3_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      process.kill(pid, 0);
    } catch (error) {
      expect((error as NodeJS.ErrnoException).code).toBe("ESRCH");
      return;
    }
    if (processState(pid) === "Z") return;
    if (Date.now() > until) {
      throw new Error(`process ${pid} is still alive (state ${processState(pid) ?? "?"})`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function readPids(file: string, count: number): Promise<number[]> {
  const pids = (await readFile(file, "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((line) => Number(line));
  expect(pids).toHaveLength(count);
  for (const pid of pids) expect(Number.isInteger(pid) && pid > 1).toBe(true);
  return pids;
}

/** A shell that starts two background sleeps in its own group, records their pids, and waits. */
function twoGrandchildren(pidFile: string): string[] {
  return ["sh", "-c", `sleep 100 & echo $! >> '${pidFile}'; sleep 100 & echo $! >> '${pidFile}'; wait`];
}

describe("BoundedCommandRunner: commands that exit", () => {
  it("returns the exit status and both captured streams", async () => {
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", "printf 'to out'; printf 'to err' >&2; exit 3"],
    });
    const exited = expectKind(outcome, "exited");
    expect(exited.code).toBe(3);
    expect(exited.signal).toBeNull();
    expect(exited.stdout.toString()).toBe("to out");
    expect(exited.stderr.toString()).toBe("to err");
  });

  it("reports a death by signal as a null code and the signal", async () => {
    const exited = expectKind(
      await new BoundedCommandRunner().run({ argv: ["sh", "-c", "kill -TERM $$"] }),
      "exited",
    );
    expect(exited.code).toBeNull();
    expect(exited.signal).toBe("SIGTERM");
  });

  it("runs in the given cwd", async () => {
    const exited = expectKind(await new BoundedCommandRunner().run({ argv: ["pwd"], cwd: dir }), "exited");
    expect(exited.stdout.toString().trim()).toBe(dir);
  });

  it("drains several MB on stdout and stderr at once without deadlock", async () => {
    const size = 3 * 1024 * 1024;
    // stderr first: a runner that read only stdout would block the child on a full stderr pipe.
    const outcome = await new BoundedCommandRunner().run({
      argv: [
        "sh",
        "-c",
        `head -c ${size} /dev/zero >&2; yes | head -c ${size}; head -c ${size} /dev/zero >&2`,
      ],
      bound: OperationBound.within(8_000),
    });
    const exited = expectKind(outcome, "exited");
    expect(exited.code).toBe(0);
    expect(exited.stdout.length).toBe(size);
    expect(exited.stdout.subarray(0, 4).toString()).toBe("y\ny\n");
    expect(exited.stderr.length).toBe(2 * size);
  });

  it("keeps at most the output cap per stream and still drains the rest", async () => {
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", `head -c ${COMMAND_OUTPUT_CAP_BYTES + 1_000_000} /dev/zero; echo done >&2`],
      bound: OperationBound.within(8_000),
    });
    const exited = expectKind(outcome, "exited");
    expect(exited.code).toBe(0);
    expect(exited.stdout.length).toBe(COMMAND_OUTPUT_CAP_BYTES);
    expect(exited.stderr.toString()).toBe("done\n");
  });

  it("round-trips a stdin payload through cat", async () => {
    const exited = expectKind(
      await new BoundedCommandRunner().run({ argv: ["cat"], stdin: "line one\nline two\n" }),
      "exited",
    );
    expect(exited.code).toBe(0);
    expect(exited.stdout.toString()).toBe("line one\nline two\n");
  });

  it("round-trips a binary stdin payload larger than the pipe buffer", async () => {
    const payload = randomBytes(2 * 1024 * 1024);
    const exited = expectKind(
      await new BoundedCommandRunner().run({
        argv: ["cat"],
        stdin: payload,
        bound: OperationBound.within(8_000),
      }),
      "exited",
    );
    expect(exited.code).toBe(0);
    expect(exited.stdout.equals(payload)).toBe(true);
  });
});

describe("BoundedCommandRunner: deadlines and interruptions", () => {
  it("kills the whole process group on the deadline and leaves verified evidence", async () => {
    const pidFile = join(dir, "pids");
    const started = Date.now();
    const outcome = await new BoundedCommandRunner(undefined, FAST).run({
      argv: twoGrandchildren(pidFile),
      bound: OperationBound.within(300),
    });
    const expired = expectKind(outcome, "expired");
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(expired.operationElapsedMs).toBeGreaterThanOrEqual(280);
    expect(expired.kill).toEqual({ ok: true });
    expect(expired.cleanup).toMatchObject({
      trigger: "deadline",
      kill_attempted: true,
      verified: true,
      error: null,
      reap_grace_ms: FAST.reapMs,
      io_drain_grace_ms: FAST.drainMs,
    });
    // The cleanup's own time: from the kill to the drained pipes.
    expect(expired.cleanup!.elapsed_ms).toBeGreaterThanOrEqual(0);
    expect(expired.cleanup!.elapsed_ms).toBeLessThan(3_000);
    const pids = await readPids(pidFile, 2);
    await Promise.all(pids.map((pid) => expectGone(pid)));
  });

  it("lets an attempt cap shorter than the operation bound end the attempt", async () => {
    const started = Date.now();
    const outcome = await new BoundedCommandRunner(undefined, FAST).run({
      argv: ["sleep", "100"],
      bound: OperationBound.within(30_000),
      attemptCapMs: 200,
    });
    const expired = expectKind(outcome, "expired");
    expect(expired.cleanup?.trigger).toBe("deadline");
    expect(expired.cleanup?.verified).toBe(true);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("caps an unbounded operation with the attempt cap", async () => {
    const outcome = await new BoundedCommandRunner(undefined, FAST).run({
      argv: ["sleep", "100"],
      attemptCapMs: 150,
    });
    expect(expectKind(outcome, "expired").cleanup?.verified).toBe(true);
  });

  it("returns expired without spawning anything when the bound has already expired", async () => {
    const marker = join(dir, "spawned");
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", `touch '${marker}'`],
      bound: OperationBound.within(0),
    });
    const expired = expectKind(outcome, "expired");
    expect(expired.cleanup).toBeNull();
    expect(expired.kill).toEqual({ ok: true });
    // Give a wrongly spawned child time to create the marker.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(existsSync(marker)).toBe(false);
  });

  it("treats an attempt cap of 0 as already expired", async () => {
    const marker = join(dir, "spawned");
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sh", "-c", `touch '${marker}'`],
      attemptCapMs: 0,
    });
    expect(expectKind(outcome, "expired").cleanup).toBeNull();
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(existsSync(marker)).toBe(false);
  });

  it("kills the process group on an operator interruption", async () => {
    const controller = new AbortController();
    const pidFile = join(dir, "pids");
    // Interrupt once both grandchildren are running (a fixed delay lost that race under load).
    const poll = setInterval(() => {
      const lines = existsSync(pidFile) ? readFileSync(pidFile, "utf8").split("\n").filter(Boolean) : [];
      if (lines.length === 2) {
        clearInterval(poll);
        controller.abort();
      }
    }, 20);
    const outcome = await new BoundedCommandRunner(controller.signal, FAST).run({
      argv: twoGrandchildren(pidFile),
      bound: OperationBound.within(20_000),
    });
    clearInterval(poll);
    const interrupted = expectKind(outcome, "interrupted");
    expect(interrupted.kill).toEqual({ ok: true });
    expect(interrupted.cleanup).toMatchObject({
      trigger: "interruption",
      kill_attempted: true,
      verified: true,
    });
    expect(interrupted.operationElapsedMs).toBeLessThan(3_000);
    const pids = await readPids(pidFile, 2);
    await Promise.all(pids.map((pid) => expectGone(pid)));
  });

  it("ignores the interruption for a command that is not interruptible", async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 50);
    const outcome = await new BoundedCommandRunner(controller.signal, FAST).run({
      argv: ["sh", "-c", "sleep 0.25; exit 7"],
      interruptible: false,
    });
    expect(controller.signal.aborted).toBe(true);
    expect(expectKind(outcome, "exited").code).toBe(7);
  });

  it("ends an unbounded sleep 60 in under a second when an interruption is pending, with verified evidence", async () => {
    const controller = new AbortController();
    controller.abort();
    const runner = new BoundedCommandRunner(controller.signal);
    const started = Date.now();
    const interrupted = expectKind(await runner.run({ argv: ["sleep", "60"] }), "interrupted");
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(interrupted.cleanup).toMatchObject({
      trigger: "interruption",
      kill_attempted: true,
      verified: true,
    });
    expect(expectKind(await runner.run({ argv: ["true"], interruptible: false }), "exited").code).toBe(0);
  });

  it("ends an unbounded sleep 60 in under a second when an interruption arrives", async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    const started = Date.now();
    const outcome = await new BoundedCommandRunner(controller.signal).run({ argv: ["sleep", "60"] });
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(expectKind(outcome, "interrupted").cleanup.verified).toBe(true);
  });

  it("does not let a blocked stdin write outlive the bound", async () => {
    const started = Date.now();
    const outcome = await new BoundedCommandRunner().run({
      argv: ["sleep", "60"],
      stdin: Buffer.alloc(8 * 1024 * 1024, 0x62),
      bound: OperationBound.within(300),
    });
    expect(expectKind(outcome, "expired").cleanup?.verified).toBe(true);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("removes its listener from the interruption signal once the command ends", async () => {
    const controller = new AbortController();
    const runner = new BoundedCommandRunner(controller.signal, FAST);
    await runner.run({ argv: ["true"] });
    await runner.run({ argv: ["sleep", "100"], attemptCapMs: 50 });
    expect(getEventListeners(controller.signal, "abort")).toHaveLength(0);
  });
});

describe("BoundedCommandRunner: launch failures", () => {
  it("rejects an empty argv with CommandLaunchError", async () => {
    const runner = new BoundedCommandRunner();
    await expect(runner.run({ argv: [] })).rejects.toThrow(CommandLaunchError);
    await expect(runner.run({ argv: [""] })).rejects.toThrow(CommandLaunchError);
  });

  it("rejects a missing binary with CommandLaunchError", async () => {
    const runner = new BoundedCommandRunner(undefined, FAST);
    const missing = join(dir, "no-such-binary");
    await expect(runner.run({ argv: [missing, "--version"] })).rejects.toThrow(CommandLaunchError);
    await expect(runner.run({ argv: ["taskshim-no-such-command-on-path"] })).rejects.toThrow(
      CommandLaunchError,
    );
  });

  it("rejects a missing binary given a stdin payload with CommandLaunchError", async () => {
    const runner = new BoundedCommandRunner(undefined, FAST);
    await expect(runner.run({ argv: [join(dir, "nope")], stdin: "payload" })).rejects.toThrow(
      CommandLaunchError,
    );
  });

  it("rejects a missing cwd with CommandLaunchError", async () => {
    const runner = new BoundedCommandRunner(undefined, FAST);
    await expect(runner.run({ argv: ["true"], cwd: join(dir, "missing") })).rejects.toThrow(
      CommandLaunchError,
    );
  });
});

describe("runChecked", () => {
  it("returns stdout of a command that exits 0", async () => {
    await expect(runChecked(new BoundedCommandRunner(), { argv: ["sh", "-c", "echo hello"] })).resolves.toBe(
      "hello\n",
    );
  });

  it("throws CommandFailedError with the exit status and stderr in the message", async () => {
    const argv = ["sh", "-c", "echo partial; echo 'disk is on fire' >&2; exit 2"];
    const error = await runChecked(new BoundedCommandRunner(), { argv }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandFailedError);
    const failed = error as CommandFailedError;
    expect(failed.message).toContain("exit status 2");
    expect(failed.message).toContain("disk is on fire");
    expect(failed.argv).toEqual(argv);
    expect(failed.outcome.kind).toBe("exited");
  });

  it("throws CommandFailedError naming the signal for a killed command", async () => {
    await expect(
      runChecked(new BoundedCommandRunner(), { argv: ["sh", "-c", "kill -KILL $$"] }),
    ).rejects.toThrow(/killed by SIGKILL/);
  });

  it("throws CommandFailedError on a deadline", async () => {
    const error = await runChecked(new BoundedCommandRunner(undefined, FAST), {
      argv: ["sleep", "100"],
      attemptCapMs: 100,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CommandFailedError);
    expect((error as CommandFailedError).message).toMatch(/sleep 100: deadline exceeded after \d+ ms/);
    expect((error as CommandFailedError).outcome.kind).toBe("expired");
  });
});

describe("CommandFailedError's message", () => {
  const exited = (code: number | null, signal: NodeJS.Signals | null, stderr: string): BoundedOutcome => ({
    kind: "exited",
    code,
    signal,
    stdout: Buffer.from("ignored"),
    stderr: Buffer.from(stderr),
  });
  const cleanup = {
    trigger: "interruption",
    elapsed_ms: 3,
    reap_grace_ms: 5_000,
    io_drain_grace_ms: 5_000,
    kill_attempted: true,
    verified: true,
    error: null,
  } as const;

  it("names the command, the exit status and the trimmed stderr; no stderr, no colon", () => {
    const error = new CommandFailedError(["mkfs.ext4", "/dev/sdf"], exited(1, null, "\n  device busy \n"));
    expect(error.name).toBe("CommandFailedError");
    expect(error.message).toBe("mkfs.ext4 /dev/sdf: exit status 1: device busy");
    expect(new CommandFailedError(["true"], exited(3, null, "  \n")).message).toBe("true: exit status 3");
  });

  it("names the signal, or says a signal when none is known", () => {
    expect(new CommandFailedError(["sleep", "9"], exited(null, "SIGKILL", "")).message).toBe(
      "sleep 9: killed by SIGKILL",
    );
    expect(new CommandFailedError(["sleep", "9"], exited(null, null, "")).message).toBe(
      "sleep 9: killed by a signal",
    );
  });

  it("says how long an interrupted or expired command ran", () => {
    const interrupted: BoundedOutcome = {
      kind: "interrupted",
      kill: { ok: true },
      operationElapsedMs: 1_234,
      cleanup,
    };
    expect(new CommandFailedError(["mount", "/x"], interrupted).message).toBe(
      "mount /x: interrupted by shutdown after 1234 ms",
    );
    const expired: BoundedOutcome = {
      kind: "expired",
      kill: { ok: true },
      operationElapsedMs: 50,
      cleanup: null,
    };
    expect(new CommandFailedError(["mount", "/x"], expired).message).toBe(
      "mount /x: deadline exceeded after 50 ms",
    );
  });
});

describe("BoundedCommandRunner: stdin", () => {
  it("gives a command without a stdin payload no stdin at all: cat ends at once", async () => {
    const outcome = await new BoundedCommandRunner(undefined, FAST).run({
      argv: ["cat"],
      bound: OperationBound.within(3_000),
    });
    const done = expectKind(outcome, "exited");
    expect(done.code).toBe(0);
    expect(done.stdout.length).toBe(0);
  });
});

describe("cleanup evidence from a real kill", () => {
  it("round-trips through JSON", async () => {
    const outcome = await new BoundedCommandRunner(undefined, FAST).run({
      argv: ["sleep", "100"],
      attemptCapMs: 100,
    });
    const { cleanup } = expectKind(outcome, "expired");
    expect(cleanup).not.toBeNull();
    expect(JSON.parse(JSON.stringify(cleanup))).toEqual(cleanup);
    // Exactly the evidence's fields, each of its type: nothing a log or a report could not carry.
    expect(Object.keys(cleanup ?? {}).sort()).toEqual([
      "elapsed_ms",
      "error",
      "io_drain_grace_ms",
      "kill_attempted",
      "reap_grace_ms",
      "trigger",
      "verified",
    ]);
    expect(cleanup).toMatchObject({ trigger: "deadline", kill_attempted: true });
    for (const ms of [cleanup?.elapsed_ms, cleanup?.reap_grace_ms, cleanup?.io_drain_grace_ms]) {
      expect(Number.isInteger(ms) && (ms ?? -1) >= 0, String(ms)).toBe(true);
    }
    expect(typeof cleanup?.verified).toBe("boolean");
    expect(cleanup?.error === null || typeof cleanup?.error === "string").toBe(true);
  });
});

describe("BoundedCommandRunner: launch failure messages", () => {
  const failure = async (request: Parameters<BoundedCommandRunner["run"]>[0]): Promise<Error> => {
    const runner = new BoundedCommandRunner(undefined, FAST);
    return rejected(runner.run(request));
  };

  it("says the argv is empty, and names a missing binary with the spawn error as the cause", async () => {
    const empty = await failure({ argv: [""] });
    expect(empty.name).toBe("CommandLaunchError");
    expect(empty.message).toBe("external command argv is empty");
    const missing = join(dir, "no-such-binary");
    const error = await failure({ argv: [missing] });
    expect(error.name).toBe("CommandLaunchError");
    expect(error.message).toMatch(new RegExp(`^cannot start ${missing}: spawn ${missing} ENOENT$`));
    expect((error.cause as NodeJS.ErrnoException).code).toBe("ENOENT");
  });
});
