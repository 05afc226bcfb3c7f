/*
 * What the probe makes of a binary's answers, and which files count as executable formats: the
 * checks between a download and the binary that runs. Commands are scripted; files are real.
 */
import { chmod, mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { BoundedOutcome } from "../exec/run-bounded.js";
import { EXPIRED, exited, INTERRUPTED, ScriptedCommands } from "../testing/fake-command-runner.js";
import { BinaryProbe, isExecutableFormat, NOT_INSTALLED, type RunningExecutable } from "./binary-probe.js";
import { fileIdentity } from "./file-identity.js";

let dir: string;
let path: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-probe-"));
  path = join(dir, "binary");
  await writeFile(path, "#!/bin/sh\n");
  await chmod(path, 0o755);
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A probe whose `--version` prints `line` and whose `version --json` answers `json`. */
const answering = (
  version: BoundedOutcome | Error,
  json: BoundedOutcome | Error = exited(1),
): ScriptedCommands =>
  new ScriptedCommands((argv) =>
    argv[1] === "--version" ? version : argv[1] === "version" ? json : exited(9),
  );

/** An `exited` outcome without an exit code: killed by `signal`. */
const killed = (signal: NodeJS.Signals | null): BoundedOutcome => ({
  kind: "exited",
  code: null,
  signal,
  stdout: Buffer.alloc(0),
  stderr: Buffer.alloc(0),
});

describe("BinaryProbe.probe", () => {
  it("a missing file, or a path through a regular file, is not installed and runs nothing", async () => {
    const commands = answering(exited(0, "dstack-runner version 1.0.0\n"));
    const probe = new BinaryProbe(commands);
    expect(await probe.probe("dstack-runner", join(dir, "missing"))).toBe(NOT_INSTALLED);
    expect(await probe.probe("dstack-runner", join(path, "below"))).toBe(NOT_INSTALLED);
    expect(NOT_INSTALLED).toEqual({ status: "not-installed", version: "" });
    expect(commands.calls).toEqual([]);
  });

  it("a file that cannot be stat'ed for another reason (a symlink loop) is an error of kind run", async () => {
    await symlink(join(dir, "loop-b"), join(dir, "loop-a"));
    await symlink(join(dir, "loop-a"), join(dir, "loop-b"));
    const commands = answering(exited(0, "dstack-runner version 1.0.0\n"));
    const seen = await new BinaryProbe(commands).probe("dstack-runner", join(dir, "loop-a"));
    expect(seen).toEqual({
      status: "error",
      version: "",
      problem: { kind: "run", message: expect.stringMatching(/^cannot stat it: .*ELOOP/) as unknown },
    });
    expect(commands.calls).toEqual([]);
  });

  it("runs `<path> --version` under one 10 s bound, and reads the trimmed version line", async () => {
    const commands = answering(exited(0, "  dstack-runner version 0.19.40 \n"));
    const seen = await new BinaryProbe(commands).probe("dstack-runner", path);
    expect(seen).toEqual({
      status: "installed",
      version: "0.19.40",
      binary: "dstack-runner",
      identity: expect.objectContaining({ size: "10" }) as unknown,
    });
    expect(commands.argvs()).toEqual([`${path} --version`]);
    const remaining = commands.calls[0]?.bound?.remainingMs() ?? 0;
    expect(remaining).toBeGreaterThan(9_000);
    expect(remaining).toBeLessThanOrEqual(10_000);
  });

  it("each way a --version can fail to answer is a problem of kind run, with the file's identity", async () => {
    const cases: [BoundedOutcome | Error, string][] = [
      [exited(3), "--version: exit status 3"],
      [killed("SIGKILL"), "--version: killed by SIGKILL"],
      [killed(null), "--version: killed by a signal"],
      [EXPIRED, "--version: did not finish within 10000 ms"],
      [INTERRUPTED, "--version: interrupted by shutdown"],
      [new Error("cannot start it: spawn EACCES"), "--version: cannot start it: spawn EACCES"],
    ];
    for (const [outcome, message] of cases) {
      const seen = await new BinaryProbe(answering(outcome)).probe("dstack-runner", path);
      expect(seen).toEqual({
        status: "error",
        version: "",
        identity: expect.objectContaining({ size: "10" }) as unknown,
        problem: { kind: "run", message },
      });
    }
  });

  it("a line that is not exactly `<name> version <X>` is content: what it printed, quoted and cut at 120 characters", async () => {
    const refused = [
      "dstack-runner version",
      "dstack-runner version ",
      "dstack-runner version 1.0 extra",
      "xdstack-runner version 1.0",
      "dstack-runner  version 1.0",
      "dstack-runner Version 1.0",
      "dstack-runner version 1.0\nsecond line",
      "taskshim-ng version 1.0",
      "<!doctype html>",
      "",
    ];
    for (const line of refused) {
      const seen = await new BinaryProbe(answering(exited(0, `${line}\n`))).probe("dstack-runner", path);
      expect(seen, line).toEqual({
        status: "error",
        version: "",
        identity: expect.objectContaining({ size: "10" }) as unknown,
        problem: { kind: "content", message: `--version printed ${JSON.stringify(line.trim())}` },
      });
    }
    const long = `dstack-runner version ${"x".repeat(200)} y`;
    const seen = await new BinaryProbe(answering(exited(0, long))).probe("dstack-runner", path);
    expect(seen.problem).toEqual({
      kind: "content",
      message: `--version printed ${JSON.stringify(long.slice(0, 120))}`,
    });
  });

  it("each component takes its own names only: taskshim and dstack-shim are dstack-shims, never dstack-runners", async () => {
    const verdict = async (name: "dstack-runner" | "dstack-shim", line: string) =>
      new BinaryProbe(answering(exited(0, line))).probe(name, path);
    expect(await verdict("dstack-runner", "dstack-runner version 1.0.0")).toMatchObject({
      status: "installed",
      binary: "dstack-runner",
    });
    expect(await verdict("dstack-shim", "dstack-shim version 0.19.1")).toMatchObject({
      status: "installed",
      version: "0.19.1",
      binary: "dstack-shim",
    });
    expect(await verdict("dstack-shim", "taskshim version 1.3.3")).toMatchObject({
      status: "installed",
      version: "1.3.3",
      binary: "taskshim",
    });
    for (const [name, line, other] of [
      ["dstack-runner", "taskshim version 1.3.3", "taskshim"],
      ["dstack-runner", "dstack-shim version 0.19.1", "dstack-shim"],
      ["dstack-shim", "dstack-runner version 0.19.1", "dstack-runner"],
    ] as const) {
      expect(await verdict(name, line)).toEqual({
        status: "error",
        version: "",
        identity: expect.objectContaining({ size: "10" }) as unknown,
        problem: { kind: "content", message: `it is ${other} (--version printed "${line}")` },
      });
    }
  });

  it("asks `version --json` of a taskshim only, under the same bound, for its build id", async () => {
    const commands = answering(exited(0, "taskshim version 1.3.3\n"), exited(0, '{"build_id":"b-1"}\n'));
    const seen = await new BinaryProbe(commands).probe("dstack-shim", path);
    expect(seen).toMatchObject({ status: "installed", version: "1.3.3", buildId: "b-1" });
    expect(commands.argvs()).toEqual([`${path} --version`, `${path} version --json`]);
    expect(commands.calls[1]?.bound).toBe(commands.calls[0]?.bound);
    for (const line of ["dstack-shim version 0.19.1", "dstack-runner version 0.19.1"]) {
      const other = answering(exited(0, line), exited(0, '{"build_id":"b-1"}'));
      const name = line.startsWith("dstack-shim") ? "dstack-shim" : "dstack-runner";
      expect(await new BinaryProbe(other).probe(name, path)).not.toHaveProperty("buildId");
      expect(other.argvs()).toEqual([`${path} --version`]);
    }
  });

  it("the running executable's own file at the dstack-shim slot is this build, with nothing run", async () => {
    const running = (file: string): RunningExecutable => ({
      identity: () => fileIdentity(file),
      version: "9.9.9",
      buildId: "running-build",
    });
    const commands = answering(exited(0, "taskshim version 1.3.3\n"), exited(0, '{"build_id":"b-1"}\n'));
    const seen = await new BinaryProbe(commands, running(path)).probe("dstack-shim", path);
    expect(seen).toEqual({
      status: "installed",
      version: "9.9.9",
      binary: "taskshim",
      buildId: "running-build",
      identity: await fileIdentity(path),
    });
    expect(commands.argvs()).toEqual([]);
    // Another file, the same file rewritten in place, or a dstack-runner slot: it is asked.
    const other = join(dir, "other");
    await writeFile(other, "#!/bin/sh\n");
    expect(await new BinaryProbe(commands, running(other)).probe("dstack-shim", path)).toMatchObject({
      version: "1.3.3",
      buildId: "b-1",
    });
    const before = running(path);
    const known = await before.identity();
    await writeFile(path, "#!/bin/sh\n# rewritten\n");
    const stale = { ...before, identity: () => Promise.resolve(known) };
    expect(await new BinaryProbe(commands, stale).probe("dstack-shim", path)).toMatchObject({
      version: "1.3.3",
    });
    const runner = answering(exited(0, "dstack-runner version 0.19.1\n"));
    expect(await new BinaryProbe(runner, running(path)).probe("dstack-runner", path)).toMatchObject({
      version: "0.19.1",
    });
    // Unknown (no /proc, say): asked as any other file.
    const unknown = { ...before, identity: () => Promise.resolve(undefined) };
    expect(await new BinaryProbe(commands, unknown).probe("dstack-shim", path)).toMatchObject({
      version: "1.3.3",
    });
    expect(commands.argvs()).toHaveLength(6);
  });

  it("a build id is printable ASCII of 1 to 256 characters, a string in a JSON object; anything else is none", async () => {
    const buildIdOf = async (json: BoundedOutcome | Error): Promise<string | undefined> =>
      (await new BinaryProbe(answering(exited(0, "taskshim version 1.3.3"), json)).probe("dstack-shim", path))
        .buildId;
    const out = (value: unknown): BoundedOutcome => exited(0, JSON.stringify(value));
    expect(await buildIdOf(out({ build_id: "x" }))).toBe("x");
    expect(await buildIdOf(out({ build_id: "a b~" }))).toBe("a b~");
    expect(await buildIdOf(out({ build_id: "y".repeat(256) }))).toBe("y".repeat(256));
    expect(await buildIdOf(out({ build_id: "y".repeat(257) }))).toBeUndefined();
    expect(await buildIdOf(out({ build_id: "" }))).toBeUndefined();
    expect(await buildIdOf(out({ build_id: "tab\there" }))).toBeUndefined();
    expect(await buildIdOf(out({ build_id: "del\x7f" }))).toBeUndefined();
    expect(await buildIdOf(out({ build_id: "é" }))).toBeUndefined();
    expect(await buildIdOf(out({ build_id: 7 }))).toBeUndefined();
    expect(await buildIdOf(out({ version: "1.3.3" }))).toBeUndefined();
    expect(await buildIdOf(out(null))).toBeUndefined();
    expect(await buildIdOf(out("build_id"))).toBeUndefined();
    expect(await buildIdOf(exited(0, "{not json"))).toBeUndefined();
    expect(await buildIdOf(exited(1, '{"build_id":"x"}'))).toBeUndefined();
    expect(await buildIdOf(new Error("spawn EACCES"))).toBeUndefined();
  });
});

describe("isExecutableFormat", () => {
  const format = async (bytes: Buffer | string): Promise<boolean> => {
    const file = join(dir, "head");
    await writeFile(file, bytes);
    return isExecutableFormat(file);
  };

  it("an ELF executable (\\x7fELF) or a #! script, whatever follows", async () => {
    expect(await format(Buffer.from([0x7f, 0x45, 0x4c, 0x46]))).toBe(true);
    expect(await format(Buffer.from([0x7f, 0x45, 0x4c, 0x46, 0x02, 0x01, 0x01, 0x00]))).toBe(true);
    expect(await format("#!")).toBe(true);
    expect(await format("#!/bin/sh\necho hi\n")).toBe(true);
  });

  it("anything else: a near miss of either, a short head, an empty file, text, a shebang not at the start", async () => {
    expect(await format(Buffer.from([0x7f, 0x45, 0x4c]))).toBe(false);
    expect(await format(Buffer.from([0x7f, 0x45, 0x4c, 0x47]))).toBe(false);
    expect(await format(Buffer.from([0x7e, 0x45, 0x4c, 0x46]))).toBe(false);
    expect(await format(Buffer.from([0x00, 0x7f, 0x45, 0x4c, 0x46]))).toBe(false);
    expect(await format("ELF binary")).toBe(false);
    expect(await format("#")).toBe(false);
    expect(await format("!#/bin/sh")).toBe(false);
    expect(await format(" #!/bin/sh")).toBe(false);
    expect(await format("# !/bin/sh")).toBe(false);
    expect(await format("")).toBe(false);
    expect(await format("<!doctype html>")).toBe(false);
  });

  it("throws for a file it cannot open", async () => {
    await expect(isExecutableFormat(join(dir, "missing"))).rejects.toThrow(/ENOENT/);
    await mkdir(join(dir, "a-dir"));
    await expect(isExecutableFormat(join(dir, "a-dir"))).rejects.toThrow(/EISDIR/);
  });
});
