import { execFileSync } from "node:child_process";
import {
  chmod,
  chown,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  rm,
  stat,
  symlink,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { isMainThread } from "node:worker_threads";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { Task } from "../tasks/task.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import { QuarantineError, quarantineStateFile, sweepQuarantine } from "./quarantine.js";
import {
  HeldTaskDirError,
  RUNNER_SUBDIR,
  TaskDirs,
  UnsafeTaskDirError,
  type ScannedTaskDir,
} from "./task-dirs.js";
import {
  CorruptTaskStateError,
  TASK_STATE_FILE,
  UnsupportedTaskStateVersionError,
  writeTaskState,
} from "./task-state-file.js";

let home: string;
let dirs: TaskDirs;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "task-dirs-"));
  dirs = new TaskDirs(home);
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

const mode = async (path: string): Promise<number> => (await stat(path)).mode & 0o777;
const exists = (path: string): Promise<boolean> =>
  stat(path).then(
    () => true,
    () => false,
  );

function makeTask(id: string, name: string): Task {
  const { config } = parseTaskConfig({ id, name, image_name: "debian" });
  return {
    id,
    status: "running",
    terminationReason: "",
    terminationMessage: "",
    config,
    containerName: `${name}-x`,
    gpuIds: [],
    taskDir: "",
    cleanedUp: false,
    startInFlight: false,
  };
}

describe("TaskDirs.dirFor", () => {
  it("puts a task dir under <home>/runners", () => {
    expect(dirs.root).toBe(join(home, "runners"));
    expect(dirs.dirFor("vllm-0-0-cff1b8da")).toBe(join(home, "runners", "vllm-0-0-cff1b8da"));
  });

  it.each(["..", "../x", "a/b", ".hidden", ".", "", "/etc", "a/../b", "a/", "x/../../etc"])(
    "refuses %j",
    (name) => {
      expect(() => dirs.dirFor(name)).toThrow(UnsafeTaskDirError);
    },
  );
});

describe("TaskDirs.make", () => {
  it("creates a private task dir and a 0755 runner subdir", async () => {
    const dir = await dirs.make("job-0-0-abcd1234");
    expect(dir).toBe(dirs.dirFor("job-0-0-abcd1234"));
    expect(await mode(dir)).toBe(0o700);
    expect(TaskDirs.runnerDir(dir)).toBe(join(dir, RUNNER_SUBDIR));
    expect(await mode(join(dir, "runner"))).toBe(0o755);
  });

  it("is idempotent, keeps the content and re-tightens a loosened task dir", async () => {
    const dir = await dirs.make("job-0-0-abcd1234");
    await writeFile(join(dir, "pull.log"), "pulled");
    await chmod(dir, 0o755);
    expect(await dirs.make("job-0-0-abcd1234")).toBe(dir);
    expect(await mode(dir)).toBe(0o700);
    expect(await readFile(join(dir, "pull.log"), "utf8")).toBe("pulled");
    expect((await readdir(dir)).sort()).toEqual(["pull.log", "runner"]);
  });

  // A worker thread cannot set the umask; StrykerJS runs the unit tests in worker threads.
  it.skipIf(!isMainThread)("keeps the documented modes under a restrictive umask", async () => {
    const previous = process.umask(0o077);
    try {
      const dir = await dirs.make("job-0-0-umask");
      expect(await mode(dir)).toBe(0o700);
      // The container user (often not root) must be able to enter the mounted runner dir.
      expect(await mode(TaskDirs.runnerDir(dir))).toBe(0o755);
    } finally {
      process.umask(previous);
    }
  });

  it("refuses an unsafe name without creating anything", async () => {
    await expect(dirs.make("../escape")).rejects.toThrow(UnsafeTaskDirError);
    expect(await exists(join(home, "escape"))).toBe(false);
    expect(await exists(dirs.root)).toBe(false);
  });
});

describe("TaskDirs.scan", () => {
  const byName = (found: ScannedTaskDir[]): Map<string, ScannedTaskDir> =>
    new Map(found.map((entry) => [basename(entry.dir), entry]));

  it("returns nothing when the runners dir does not exist", async () => {
    await expect(dirs.scan()).resolves.toEqual([]);
  });

  it("sorts task dirs into state, unreadable and no-state, skipping dot dirs and files", async () => {
    const good = await dirs.make("good-0-0-11111111");
    await writeTaskState(good, makeTask("t-good", "good-0-0"), "boot");
    await writeFile(join(good, "pull.log"), "{}");
    const corrupt = await dirs.make("corrupt-0-0-22222222");
    await writeFile(join(corrupt, TASK_STATE_FILE), '{"version":1,"id":"t-corr');
    const newer = await dirs.make("newer-0-0-33333333");
    await writeFile(join(newer, TASK_STATE_FILE), '{"version":2,"id":"t-newer"}\n');
    const legacy = await dirs.make("legacy-0-0-44444444");
    const trash = join(dirs.root, ".trash-old-0-0-55555555-1700000000000000");
    await mkdir(trash);
    await writeTaskState(trash, makeTask("t-trash", "old-0-0"), "boot");
    await writeFile(join(dirs.root, "stray-file"), "not a dir");

    const found = byName(await dirs.scan());
    expect([...found.keys()].sort()).toEqual([
      "corrupt-0-0-22222222",
      "good-0-0-11111111",
      "legacy-0-0-44444444",
      "newer-0-0-33333333",
    ]);

    const goodEntry = found.get("good-0-0-11111111");
    expect(goodEntry?.kind).toBe("state");
    expect(goodEntry?.dir).toBe(good);
    if (goodEntry?.kind === "state") {
      expect(goodEntry.state.id).toBe("t-good");
      expect(goodEntry.state.config.name).toBe("good-0-0");
    }

    const corruptEntry = found.get("corrupt-0-0-22222222");
    expect(corruptEntry?.kind).toBe("unreadable");
    if (corruptEntry?.kind === "unreadable") expect(corruptEntry.error).toBeInstanceOf(CorruptTaskStateError);

    const newerEntry = found.get("newer-0-0-33333333");
    expect(newerEntry?.kind).toBe("unreadable");
    if (newerEntry?.kind === "unreadable") {
      expect(newerEntry.error).toBeInstanceOf(UnsupportedTaskStateVersionError);
    }

    expect(found.get("legacy-0-0-44444444")).toEqual({ kind: "no-state", dir: legacy, names: ["runner"] });
    expect([...(goodEntry?.names ?? [])].sort()).toEqual(["pull.log", "runner", "task.json"]);
  });

  it("yields to the event loop between slices, and finds the same as a scan in one slice", async () => {
    for (let i = 0; i < 5; i++) {
      const dir = await dirs.make(`job-${i}-0-7777777${i}`);
      await writeTaskState(dir, makeTask(`t-${i}`, `job-${i}-0`), "boot");
    }
    const whole = await dirs.scan(Number.POSITIVE_INFINITY);
    // Queued before each scan: it runs before a scan that yields ends, after one that does not.
    const ranBefore = async (sliceMs: number): Promise<boolean> => {
      let ran = false;
      setImmediate(() => (ran = true));
      const found = await dirs.scan(sliceMs).then((scanned) => ({ scanned, ran }));
      expect(found.scanned).toEqual(whole);
      return found.ran;
    };
    expect(await ranBefore(0)).toBe(true);
    expect(await ranBefore(Number.POSITIVE_INFINITY)).toBe(false);
    expect(whole.map((entry) => entry.kind)).toEqual(["state", "state", "state", "state", "state"]);
  });

  it("deletes stale temp files of task.json and nothing else", async () => {
    const dir = await dirs.make("job-0-0-66666666");
    await writeTaskState(dir, makeTask("t-1", "job-0-0"), "boot");
    await writeFile(join(dir, ".task.json.tmp-1234-1"), '{"version":1,"id":"half');
    await writeFile(join(dir, ".task.json.tmp-99-7"), "");
    await writeFile(join(dir, "pull.log"), "keep");
    await writeFile(join(dir, ".other.tmp-1"), "keep");
    const legacy = await dirs.make("legacy-0-0-77777777");
    await writeFile(join(legacy, ".task.json.tmp-5-5"), "");

    const found = await dirs.scan();
    expect(found.map((entry) => entry.kind).sort()).toEqual(["no-state", "state"]);
    expect((await readdir(dir)).sort()).toEqual([".other.tmp-1", "pull.log", "runner", "task.json"]);
    expect(await readdir(legacy)).toEqual(["runner"]);
    // The names reported are those left: the swept temp files are not among them.
    const names = new Map(found.map((entry) => [entry.dir, [...(entry.names ?? [])].sort()]));
    expect(names.get(dir)).toEqual([".other.tmp-1", "pull.log", "runner", "task.json"]);
    expect(names.get(legacy)).toEqual(["runner"]);
  });

  it("reports a task.json that is not a file as unreadable", async () => {
    const dir = await dirs.make("odd-0-0-88888888");
    await mkdir(join(dir, TASK_STATE_FILE));
    const [entry] = await dirs.scan();
    expect(entry?.kind).toBe("unreadable");
  });
});

describe("TaskDirs: what a start does not trust", () => {
  const byName = (found: ScannedTaskDir[]): Map<string, ScannedTaskDir> =>
    new Map(found.map((entry) => [basename(entry.dir), entry]));

  it("S9 reports a FIFO task.json and one symlinked to /dev/zero as unreadable at once, never waiting or following", async () => {
    const fifo = await dirs.make("fifo-0-0-11111111");
    execFileSync("mkfifo", [join(fifo, TASK_STATE_FILE)]);
    const zero = await dirs.make("zero-0-0-22222222");
    await symlink("/dev/zero", join(zero, TASK_STATE_FILE));
    const started = performance.now();
    const found = byName(await dirs.scan());
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(found.get("fifo-0-0-11111111")).toMatchObject({
      kind: "unreadable",
      error: { name: "NotRegularFileError", kind: "a FIFO" },
    });
    expect(found.get("zero-0-0-22222222")).toMatchObject({
      kind: "unreadable",
      error: { name: "NotRegularFileError", kind: "a symbolic link" },
    });
  });

  it("S12 never follows a symlinked task dir nor enters another user's dir: both unsafe, their task.json unread", async () => {
    const elsewhere = join(home, "elsewhere");
    await mkdir(elsewhere);
    await writeTaskState(elsewhere, makeTask("t-link", "link-0-0"), "boot");
    await mkdir(dirs.root, { recursive: true });
    await symlink(elsewhere, join(dirs.root, "link-0-0-33333333"));
    const other = await dirs.make("other-0-0-44444444");
    await writeTaskState(other, makeTask("t-other", "other-0-0"), "boot");
    await chown(other, 65534, 65534);
    const found = byName(await dirs.scan());
    expect(found.get("link-0-0-33333333")).toEqual({
      kind: "unsafe",
      dir: join(dirs.root, "link-0-0-33333333"),
      why: `it is a symbolic link (to ${elsewhere}), not a directory`,
      names: undefined,
    });
    expect(found.get("other-0-0-44444444")).toMatchObject({
      kind: "unsafe",
      why: `it is owned by uid 65534, not the shim's (${process.getuid?.()})`,
    });
    // Moved aside whole: the link as a link (its target untouched), the dir with what it holds.
    const moved = await dirs.quarantineDir(join(dirs.root, "link-0-0-33333333"), "a symlink");
    expect(basename(moved)).toMatch(/^link-0-0-33333333\.\d+\.taskdir$/);
    expect((await lstat(moved)).isSymbolicLink()).toBe(true);
    expect(await readdir(elsewhere)).toEqual([TASK_STATE_FILE]);
    await dirs.quarantineDir(other, "another user's");
    expect(await exists(other)).toBe(false);
    expect(await dirs.scan()).toEqual([]);
    // Swept as entries of their own: the link removed, never followed.
    expect(await dirs.sweepQuarantine()).toBe(2);
    // Old by the clock, and then by starts too (the third start after the first that saw them).
    const later = Date.now() + 31 * 24 * 60 * 60 * 1000;
    expect(await sweepQuarantine(home, later)).toBe(2);
    expect(await sweepQuarantine(home, later)).toBe(2);
    expect(await sweepQuarantine(home, later)).toBe(0);
    expect(await readdir(join(home, "quarantine"))).toEqual([".sweeps.json"]);
    expect(await readdir(elsewhere)).toEqual([TASK_STATE_FILE]);
  });

  it("S12 narrows a task dir wider than 0700, and says from what", async () => {
    const wide = await dirs.make("wide-0-0-55555555");
    await writeTaskState(wide, makeTask("t-wide", "wide-0-0"), "boot");
    await chmod(wide, 0o777);
    const [entry] = await dirs.scan();
    expect(entry).toMatchObject({ kind: "state", narrowedFrom: 0o777 });
    expect(await mode(wide)).toBe(0o700);
    const [again] = await dirs.scan();
    expect(again).not.toHaveProperty("narrowedFrom");
  });

  it("make refuses a held dir, a symlink and another user's dir, writing nothing through them", async () => {
    const held = dirs.dirFor("held-0-0-66666666");
    dirs.hold(held, { kind: "newer-format", version: 2 });
    await expect(dirs.make("held-0-0-66666666")).rejects.toThrow(HeldTaskDirError);
    expect(await exists(held)).toBe(false);
    const elsewhere = join(home, "elsewhere");
    await mkdir(elsewhere);
    await mkdir(dirs.root, { recursive: true });
    await symlink(elsewhere, dirs.dirFor("link-0-0-77777777"));
    await expect(dirs.make("link-0-0-77777777")).rejects.toThrow(UnsafeTaskDirError);
    const other = await dirs.make("other-0-0-88888888");
    await chown(other, 65534, 65534);
    await expect(dirs.make("other-0-0-88888888")).rejects.toThrow("owned by uid 65534");
    expect(await readdir(elsewhere)).toEqual([]);
  });

  it("S15 a quarantine that is not a directory fails the move: the file stays, no note anywhere", async () => {
    const dir = await dirs.make("bad-0-0-99999999");
    await writeFile(join(dir, TASK_STATE_FILE), "garbage");
    await writeFile(join(home, "quarantine"), "a file where the quarantine should be");
    const error = await dirs.quarantine(dir, "bad").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(QuarantineError);
    expect((error as Error).message).toBe(
      `the quarantine ${join(home, "quarantine")} is a regular file, not a directory`,
    );
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe("garbage");
    // A symlinked quarantine would send the evidence elsewhere: refused alike, and never swept.
    await rm(join(home, "quarantine"));
    const elsewhere = join(home, "elsewhere");
    await mkdir(elsewhere);
    await writeFile(join(elsewhere, "x.1.task.json"), "not ours");
    await symlink(elsewhere, join(home, "quarantine"));
    await expect(dirs.quarantine(dir, "bad")).rejects.toThrow("is a symbolic link, not a directory");
    expect(await dirs.sweepQuarantine()).toBe(0);
    expect(await readdir(elsewhere)).toEqual(["x.1.task.json"]);
  });
});

describe("TaskDirs.quarantine", () => {
  it("moves task.json to <home>/quarantine with a note of why, keeping its bytes; the next scan sees no state", async () => {
    const dir = await dirs.make("bad-0-0-99999999");
    await writeFile(join(dir, TASK_STATE_FILE), "garbage");
    const target = await dirs.quarantine(dir, "task state is not valid JSON");
    expect(basename(target)).toMatch(/^bad-0-0-99999999\.\d+\.task\.json$/);
    expect(target.startsWith(`${join(home, "quarantine")}/`)).toBe(true);
    expect(await readFile(target, "utf8")).toBe("garbage");
    const note = JSON.parse(await readFile(target.replace(/\.task\.json$/, ".note.json"), "utf8")) as Record<
      string,
      unknown
    >;
    expect(note).toMatchObject({ task_dir: dir, reason: "task state is not valid JSON" });
    expect(await exists(join(dir, TASK_STATE_FILE))).toBe(false);
    const [entry] = await dirs.scan();
    expect(entry).toMatchObject({ kind: "no-state", dir });
  });

  it("keeps the quarantined file when the task's dir is removed later", async () => {
    const dir = await dirs.make("gone-0-0-99999999");
    await writeFile(join(dir, TASK_STATE_FILE), "garbage");
    const target = await dirs.quarantine(dir, "bad");
    await dirs.remove(dir);
    expect(await readFile(target, "utf8")).toBe("garbage");
    expect(await dirs.sweepQuarantine()).toBe(1);
  });

  it("fails when there is no task.json to quarantine, and leaves no note behind", async () => {
    const dir = await dirs.make("empty-0-0-00000000");
    const error = await dirs.quarantine(dir, "bad").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(QuarantineError);
    expect(((error as Error).cause as NodeJS.ErrnoException).code).toBe("ENOENT");
    expect(await readdir(join(home, "quarantine"))).toEqual([]);
  });
});

describe("sweepQuarantine", () => {
  const DAY = 24 * 60 * 60 * 1000;
  it("keeps the newest files within the age and count, and deletes the rest with their notes", async () => {
    const now = Date.UTC(2026, 11, 1);
    for (const [name, age] of [
      ["a", 1],
      ["b", 2],
      ["c", 3],
      ["old", 40],
    ] as const) {
      const dir = await dirs.make(`${name}-0-0-11111111`);
      await writeFile(join(dir, TASK_STATE_FILE), name);
      await quarantineStateFile(home, dir, TASK_STATE_FILE, "why", "9.9.9", now - age * DAY);
    }
    await writeFile(join(home, "quarantine", "orphan.5.note.json"), "{}");
    await writeFile(join(home, "quarantine", "README"), "kept: not ours");
    expect(await sweepQuarantine(home, now, { maxAgeMs: 30 * DAY, maxFiles: 2, minSweeps: 3 })).toBe(2);
    const left = (await readdir(join(home, "quarantine"))).sort();
    expect(left.filter((n) => n.endsWith(".task.json")).map((n) => n.split("-")[0])).toEqual(["a", "b"]);
    expect(left.filter((n) => n.endsWith(".note.json"))).toHaveLength(2);
    expect(left).toContain("README");
  });

  it("deletes no evidence for a wall clock stepped years ahead alone: age by starts is needed too", async () => {
    const now = Date.now();
    const dir = await dirs.make("jump-0-0-11111111");
    await writeFile(join(dir, TASK_STATE_FILE), "evidence");
    await quarantineStateFile(home, dir, TASK_STATE_FILE, "why", "9.9.9", now);
    const jumped = now + 10 * 365 * DAY;
    expect(await sweepQuarantine(home, jumped)).toBe(1);
    expect(await sweepQuarantine(home, jumped)).toBe(1);
    // A clock stepped back: never older than it was, and the count of starts is unmoved.
    expect(await sweepQuarantine(home, now - 365 * DAY)).toBe(1);
    expect(await sweepQuarantine(home, jumped)).toBe(0);
  });

  it("counts from zero again when its count is damaged: files look newer, never older", async () => {
    const now = Date.now();
    const dir = await dirs.make("count-0-0-11111111");
    await writeFile(join(dir, TASK_STATE_FILE), "evidence");
    await quarantineStateFile(home, dir, TASK_STATE_FILE, "why", "9.9.9", now - 40 * DAY);
    expect(await sweepQuarantine(home, now)).toBe(1);
    expect(await sweepQuarantine(home, now)).toBe(1);
    await writeFile(join(home, "quarantine", ".sweeps.json"), "{damaged");
    for (let i = 0; i < 3; i++) expect(await sweepQuarantine(home, now)).toBe(1);
    expect(await sweepQuarantine(home, now)).toBe(0);
  });

  it("holds nothing when there is no quarantine", async () => {
    expect(await sweepQuarantine(join(home, "nowhere"))).toBe(0);
  });
});

describe("TaskDirs.remove", () => {
  it("deletes the task dir and everything in it", async () => {
    const dir = await dirs.make("done-0-0-12121212");
    await writeTaskState(dir, makeTask("t-done", "done-0-0"), "boot");
    await writeFile(join(TaskDirs.runnerDir(dir), "runner.log"), "log");
    await dirs.remove(dir);
    expect(await exists(dir)).toBe(false);
    expect(await readdir(dirs.root)).toEqual([]);
  });

  it("is a no-op for a dir that is already gone", async () => {
    const dir = await dirs.make("gone-0-0-34343434");
    await dirs.remove(dir);
    await expect(dirs.remove(dir)).resolves.toBeUndefined();
    expect(await exists(dir)).toBe(false);
  });
});

describe("TaskDirs errors", () => {
  it("names an unsafe name in the error", () => {
    const error = (() => {
      try {
        return dirs.dirFor("../x");
      } catch (caught) {
        return caught as Error;
      }
    })() as Error;
    expect([error.name, error.message]).toEqual(["UnsafeTaskDirError", 'refusing task dir name "../x"']);
  });

  it("scan passes on an error other than a missing runners dir", async () => {
    await writeFile(dirs.root, "a file where the runners dir belongs");
    await expect(dirs.scan()).rejects.toMatchObject({ code: "ENOTDIR" });
  });
});

describe("TaskDirs.sweepLeftovers", () => {
  it("is empty when there is no runners dir", async () => {
    expect(await dirs.sweepLeftovers(new Set())).toEqual([]);
  });

  it("deletes .trash-* dirs and dirs holding nothing or only an empty runner/, and nothing else", async () => {
    const emptyRunner = await dirs.make("cut-0-0-11111111");
    const bare = join(dirs.root, "bare-0-0-22222222");
    await mkdir(bare);
    const trash = join(dirs.root, ".trash-old-0-0-33333333-1700000000000000");
    await mkdir(join(trash, RUNNER_SUBDIR), { recursive: true });
    await writeFile(join(trash, TASK_STATE_FILE), "{}");
    // Kept: a state file, a non-empty runner/, another file, a dir a container still uses,
    // a dot dir that is not trash, and a plain file.
    const withState = await dirs.make("live-0-0-44444444");
    await writeTaskState(withState, makeTask("t-live", "live-0-0"), "boot");
    const busyRunner = await dirs.make("busy-0-0-55555555");
    await writeFile(join(TaskDirs.runnerDir(busyRunner), "runner.log"), "log");
    const otherFile = await dirs.make("other-0-0-66666666");
    await writeFile(join(otherFile, "pull.log"), "");
    const kept = await dirs.make("kept-0-0-77777777");
    await mkdir(join(dirs.root, ".hidden"));
    await writeFile(join(dirs.root, "plain-file"), "");

    const swept = await dirs.sweepLeftovers(new Set([basename(kept)]));

    expect(swept.sort()).toEqual([bare, emptyRunner, trash].sort());
    expect((await readdir(dirs.root)).sort()).toEqual(
      [
        ".hidden",
        basename(busyRunner),
        basename(kept),
        basename(otherFile),
        basename(withState),
        "plain-file",
      ].sort(),
    );
  });
});
