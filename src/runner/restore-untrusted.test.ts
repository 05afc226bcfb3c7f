/*
 * The restore over a home that holds what it should not: state files that are FIFOs, symlinks,
 * too large or forged, task dirs that are symlinks, another user's or too wide, a quarantine
 * that cannot take them, and a newer release's files. The start goes on, never blocks, reports
 * each, and never writes over what it could not read.
 */
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import {
  chmod,
  chown,
  lstat,
  mkdir,
  readdir,
  readFile,
  stat,
  symlink,
  truncate,
  writeFile,
} from "node:fs/promises";
import { basename, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID } from "../docker/docker-client.js";
import { QuarantineError } from "../state/quarantine.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { containerNameFor } from "../tasks/container-name.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { taskConfig } from "../testing/fixtures.js";
import { makeContext, TEST_HOME_ID, type TestEnv } from "../testing/test-context.js";
import { restoreTasks } from "./restore.js";
import { TaskStateError } from "./task-errors.js";

let env: TestEnv;
const extraEnvs: TestEnv[] = [];

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  vi.restoreAllMocks();
  for (const extra of extraEnvs.splice(0)) await extra.dispose();
  await env.dispose();
});

/** A second shim over the same home and engine, its log lines captured. */
async function restart(): Promise<{ next: TestEnv; lines: string[] }> {
  const { log, lines } = capturingLogger();
  const next = await makeContext({ home: env.home, docker: env.docker, log });
  extraEnvs.push(next);
  return { next, lines };
}

const logged = (lines: readonly string[], msg: string): Record<string, unknown>[] =>
  lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === msg);

/** A task dir under the home's runners, made by hand (as a user or an older tool would). */
async function taskDir(name: string): Promise<string> {
  const dir = join(env.home, "runners", name);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** A v1 task.json as this version writes it, with `extra` over it. */
function stateText(id: string, name: string, extra: Record<string, unknown> = {}): string {
  return `${JSON.stringify({
    version: 1,
    id,
    config: { id, name, image_name: "busybox" },
    termination_reason: "",
    termination_message: "",
    cleaned_up: false,
    ...extra,
  })}\n`;
}

/** The notes in the quarantine, by the name of what they stand beside. */
async function notes(): Promise<Map<string, Record<string, unknown>>> {
  const root = join(env.home, "quarantine");
  const names = await readdir(root);
  const found = new Map<string, Record<string, unknown>>();
  for (const name of names.filter((n) => n.endsWith(".note.json"))) {
    const stem = name.slice(0, -".note.json".length);
    const entry = names.find((n) => n !== name && n.startsWith(`${stem}.`)) ?? "";
    found.set(entry, JSON.parse(await readFile(join(root, name), "utf8")) as Record<string, unknown>);
  }
  return found;
}

describe("restoreTasks over state files a start must not trust", () => {
  it("S9 quarantines a FIFO task.json and one symlinked to /dev/zero with a note each, at once, and restores the rest", async () => {
    const good = await env.submitAndStart();
    const fifo = await taskDir("fifo-0-0-11111111");
    execFileSync("mkfifo", [join(fifo, TASK_STATE_FILE)]);
    const zero = await taskDir("zero-0-0-22222222");
    await symlink("/dev/zero", join(zero, TASK_STATE_FILE));
    const { next, lines } = await restart();
    const started = performance.now();
    const report = await restoreTasks(next.ctx);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(report.quarantined).toHaveLength(2);
    expect(report.quarantineFailed).toEqual([]);
    const found = await notes();
    const reasons = [...found].map(([entry, note]) => [entry.replace(/\.\d+\./, ".<ms>."), note.reason]);
    expect(reasons.sort()).toEqual([
      ["fifo-0-0-11111111.<ms>.task.json", `${join(fifo, TASK_STATE_FILE)} is a FIFO, not a regular file`],
      [
        "zero-0-0-22222222.<ms>.task.json",
        `${join(zero, TASK_STATE_FILE)} is a symbolic link, not a regular file`,
      ],
    ]);
    // Moved as what they are: the FIFO and the link, never opened, never followed.
    const moved = await Promise.all(report.quarantined.map((p) => lstat(p)));
    expect(moved.map((m) => m.isFIFO() || m.isSymbolicLink())).toEqual([true, true]);
    expect(logged(lines, "corrupt task state quarantined")).toHaveLength(2);
    expect(next.ctx.store.mustGet(good.id).status).toBe("running");
  });

  it("S10 quarantines a task.json beyond 1 MiB unread, with the size in its note", async () => {
    const dir = await taskDir("big-0-0-33333333");
    await writeFile(join(dir, TASK_STATE_FILE), stateText("big-task", "big-0-0"));
    await truncate(join(dir, TASK_STATE_FILE), 63 * 1024 * 1024);
    const { next } = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined).toHaveLength(1);
    expect([...(await notes()).values()][0]?.reason).toBe(
      `${join(dir, TASK_STATE_FILE)} is larger than 1 MiB (66060288 bytes)`,
    );
    expect(next.ctx.store.get("big-task")).toBeUndefined();
  });

  it("S11 quarantines a task.json with a forged id or name as corrupt, never loading it", async () => {
    const cases = [
      ["long-0-0-44444444", stateText("a".repeat(300), "long-0-0")],
      ["slash-0-0-55555555", stateText("../../etc/passwd", "slash-0-0")],
      ["bell-0-0-66666666", stateText("bell\u0007id", "bell-0-0")],
      ["name-0-0-77777777", stateText("name-id", "../../x")],
    ] as const;
    for (const [name, text] of cases) await writeFile(join(await taskDir(name), TASK_STATE_FILE), text);
    const { next } = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined).toHaveLength(4);
    expect(next.ctx.store.size).toBe(0);
    const reasons = [...(await notes()).values()].map((n) => String(n.reason)).sort();
    expect(reasons).toEqual([
      'task state has an invalid id "../../etc/passwd"',
      `task state has an invalid id "${"a".repeat(64)}" (300 characters)`,
      'task state has an invalid id "bell\\u0007id"',
      'task state has an invalid name "../../x"',
    ]);
  });

  it("S12 quarantines a symlinked task dir and another user's, without following or entering them; narrows a 0777 one", async () => {
    const elsewhere = join(env.home, "elsewhere");
    await mkdir(elsewhere);
    await writeFile(join(elsewhere, TASK_STATE_FILE), stateText("linked", "linked-0-0"));
    await mkdir(join(env.home, "runners"), { recursive: true });
    await symlink(elsewhere, join(env.home, "runners", "linked-0-0-88888888"));
    const other = await taskDir("other-0-0-99999999");
    await writeFile(join(other, TASK_STATE_FILE), stateText("other", "other-0-0"));
    await chown(other, 65534, 65534);
    const wide = await env.submitAndStart();
    await chmod(wide.taskDir, 0o777);
    const { next, lines } = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined.map((p) => basename(p).replace(/\.\d+\./, ".<ms>.")).sort()).toEqual([
      "linked-0-0-88888888.<ms>.taskdir",
      "other-0-0-99999999.<ms>.taskdir",
    ]);
    expect(next.ctx.store.get("linked")).toBeUndefined();
    expect(next.ctx.store.get("other")).toBeUndefined();
    expect(await readdir(elsewhere)).toEqual([TASK_STATE_FILE]);
    expect(logged(lines, "task dir quarantined")).toHaveLength(2);
    // The wide dir is this shim's own: narrowed, said once, and its task restored.
    expect((await stat(wide.taskDir)).mode & 0o777).toBe(0o700);
    expect(logged(lines, "task dir was wider than 0700; narrowed to 0700")).toEqual([
      expect.objectContaining({ dir: wide.taskDir, mode: "0777" }),
    ]);
    expect(next.ctx.store.mustGet(wide.id).status).toBe("running");
  });
});

describe("S15 a quarantine that fails", () => {
  it("is reported as failed, the file left as it was, its dir held: a terminate, a remove and a submit answer 409, nothing is written over it", async () => {
    // A running task whose task.json was damaged while the shim was down.
    const task = await env.submitAndStart();
    await writeFile(join(task.taskDir, TASK_STATE_FILE), "{damaged");
    // The quarantine cannot take it: a file where its dir should be.
    await writeFile(join(env.home, "quarantine"), "in the way");
    const { next, lines } = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.quarantined).toEqual([]);
    expect(report.quarantineFailed).toEqual([task.taskDir]);
    expect(logged(lines, "corrupt task state quarantined")).toEqual([]);
    const failed = logged(
      lines,
      "corrupt task state could not be quarantined: left in place and never written, until a human moves it",
    );
    expect(failed).toEqual([
      expect.objectContaining({
        level: 50,
        dir: task.taskDir,
        reason: "task state is not valid JSON",
        quarantineError: `the quarantine ${join(env.home, "quarantine")} is a regular file, not a directory`,
      }),
    ]);
    // Its container still runs: the task is shown from it, read-only.
    const restored = next.ctx.store.mustGet(task.id);
    expect(restored).toMatchObject({ status: "running", held: { kind: "unquarantined" } });
    await next.reconciler.tick();
    await expect(next.runner.terminate(task.id, 0, "terminated_by_user", "")).rejects.toThrow(TaskStateError);
    await expect(next.runner.terminate(task.id, 0, "terminated_by_user", "")).rejects.toThrow(
      /could not move to the quarantine \(the quarantine .* is a regular file, not a directory\): it is left as it is until a human moves it$/,
    );
    await expect(next.runner.submit(task.config, { username: "", password: "" })).rejects.toThrow(
      TaskStateError,
    );
    expect(await readFile(join(task.taskDir, TASK_STATE_FILE), "utf8")).toBe("{damaged");
  });

  it("of a dir without a container: a submit of the task it held answers 409 and writes nothing", async () => {
    const { config } = taskConfig({ id: "lost-task", name: "lost" });
    const dir = await taskDir(containerNameFor(config.name, config.id));
    await writeFile(join(dir, TASK_STATE_FILE), "{damaged");
    const { next } = await restart();
    vi.spyOn(next.ctx.dirs, "quarantine").mockRejectedValue(
      new QuarantineError("cannot move it: ENOSPC: no space left on device"),
    );
    const report = await restoreTasks(next.ctx);
    expect(report.quarantineFailed).toEqual([dir]);
    await expect(next.runner.submit(config, { username: "", password: "" })).rejects.toThrow(
      "task lost-task has a task.json this release cannot read and could not move to the quarantine (cannot move it: ENOSPC: no space left on device): it is left as it is until a human moves it",
    );
    expect(next.ctx.store.get("lost-task")).toBeUndefined();
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe("{damaged");
    expect(await readdir(dir)).toEqual([TASK_STATE_FILE]);
  });
});

describe("a newer release's task.json", () => {
  it("S17 a v1 file with a status this release does not know, without a container: kept as written, shown pending, never finalized, resumed or released", async () => {
    const dir = await taskDir("queued-0-0-aaaaaaaa");
    const text = stateText("queued-task", "queued-0-0", { status: "queued", boot_id: "an-earlier-boot" });
    await writeFile(join(dir, TASK_STATE_FILE), text);
    const { next, lines } = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.skippedNewer).toEqual([dir]);
    expect(report.resumed).toEqual([]);
    expect(report.changed).toEqual([]);
    expect(next.ctx.store.mustGet("queued-task")).toMatchObject({
      status: "pending",
      held: { kind: "newer-status", status: "queued" },
    });
    await next.reconciler.tick();
    await next.runner.awaitStarts();
    expect(next.ctx.store.mustGet("queued-task").status).toBe("pending");
    expect(logged(lines, "task state with a newer release's status left alone")).toEqual([
      expect.objectContaining({ dir, taskId: "queued-task", status: "queued" }),
    ]);
    await expect(next.runner.terminate("queued-task", 0, "terminated_by_user", "")).rejects.toThrow(
      'task queued-task is held by a newer taskshim (task.json status "queued"): this release leaves it alone',
    );
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe(text);
  });

  it("S17 a v1 file with a status this release does not know, with its container: shown from the container, never stopped", async () => {
    const { config } = taskConfig({ id: "queued-run", name: "qrun" });
    const name = containerNameFor(config.name, config.id);
    const dir = await taskDir(name);
    const text = stateText(config.id, config.name, { status: "suspending" });
    await writeFile(join(dir, TASK_STATE_FILE), text);
    const container = env.docker.addContainer({
      taskId: config.id,
      name,
      state: "running",
      labels: { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: config.id, [LABEL_OWNER]: TEST_HOME_ID },
    });
    const { next } = await restart();
    await restoreTasks(next.ctx);
    expect(next.ctx.store.mustGet(config.id)).toMatchObject({
      status: "running",
      containerId: container.id,
      held: { kind: "newer-status", status: "suspending" },
    });
    env.docker.exit(container.id, 0);
    await next.reconciler.tick();
    // Not finalized: its status is the newer release's to set.
    expect(next.ctx.store.mustGet(config.id).status).toBe("running");
    expect(env.docker.count("stopContainer")).toBe(0);
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe(text);
    expect(existsSync(dir)).toBe(true);
  });
});
