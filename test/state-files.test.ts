import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import {
  chmod,
  chown,
  lstat,
  mkdir,
  readdir,
  readFile,
  rm,
  stat,
  symlink,
  writeFile,
} from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleLaunch, SHIM_BUNDLE, ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * A start over a home that holds what it must not trust (docs/fault-matrix.md rows S9 to S16,
 * and A17), with the built shim as a real process: state files that are FIFOs, symlinks, too
 * large or forged, task dirs that are symlinks, another user's or too wide, a FIFO for shim.log
 * or for the home's identity, a quarantine that cannot take what it is given, a newer release's
 * task.json, and a SIGTERM while the restore is held. Before, several of these held the start
 * for ever with the home lock taken. Runs as root (a dir is handed to another uid).
 */

const exec = promisify(execFile);
/** STATE_FILES_SHIM_BUNDLE runs another bundle than dist/taskshim.cjs (an older build, say). */
const bundle = process.env.STATE_FILES_SHIM_BUNDLE ?? SHIM_BUNDLE;
const started: ShimProcess[] = [];
const homes: string[] = [];

async function start(options: Parameters<typeof ShimProcess.start>[0]): Promise<ShimProcess> {
  const shim = await ShimProcess.start({ ...options, bundle });
  started.push(shim);
  return shim;
}

async function newHome(): Promise<string> {
  const home = await tempHome("taskshim-state-files-");
  homes.push(home);
  return home;
}

afterAll(async () => {
  for (const shim of started) await shim.stop().catch(() => undefined);
  for (const home of homes) await rm(home, { recursive: true, force: true });
});

/** `<name>-<8 hex>`, as the shim names a task's dir and container. */
const containerName = (name: string, id: string): string =>
  `${name}-${createHash("sha256").update(`${name}/${id}`).digest("hex").slice(0, 8)}`;

/** A task.json of `version`, with `extra` over it. */
function stateText(id: string, name: string, extra: Record<string, unknown> = {}, version = 1): string {
  return `${JSON.stringify({
    version,
    id,
    config: { id, name, image_name: "busybox:1.36" },
    termination_reason: "terminated_by_user",
    termination_message: "",
    cleaned_up: true,
    status: "terminated",
    ...extra,
  })}\n`;
}

async function taskDir(home: string, name: string): Promise<string> {
  const dir = join(home, "runners", name);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  return dir;
}

/** The quarantine's entries (without notes), by the dir name they came from. */
async function quarantined(home: string): Promise<Map<string, { entry: string; reason: string }>> {
  const root = join(home, "quarantine");
  const names = await readdir(root);
  const found = new Map<string, { entry: string; reason: string }>();
  // Entries only: not their notes, nor the sweep's own count (`.sweeps.json`).
  for (const entry of names.filter((n) => /\.(task\.json|taskdir)$/.test(n))) {
    const stem = entry.replace(/\.(task\.json|taskdir)$/, "");
    const note = JSON.parse(await readFile(join(root, `${stem}.note.json`), "utf8")) as { reason: string };
    found.set(stem.replace(/\.\d+$/, ""), { entry, reason: note.reason });
  }
  return found;
}

/** The shim's peak resident memory so far (VmHWM), in MB. */
const peakRssMb = (pid: number): number =>
  Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) / 1024;

/** Parsed JSON log lines of a shim's output with this message. */
const logged = (shim: ShimProcess, msg: string): Record<string, unknown>[] =>
  shim.logs
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.msg === msg);

describe("one start over a home holding every fault at once", () => {
  let home: string;
  let shim: ShimProcess;
  let startMs: number;
  const elsewhere = { dir: "" };
  const newer = { id: "newer-task-1", name: "newer", text: "" };
  const wide = { id: "wide-task-1", name: "wide" };

  beforeAll(async () => {
    home = await newHome();
    // S9: a FIFO nobody writes to, and a symlink to an endless device.
    execFileSync("mkfifo", [join(await taskDir(home, "fifo-0-0-11111111"), "task.json")]);
    await symlink("/dev/zero", join(await taskDir(home, "zero-0-0-22222222"), "task.json"));
    // S10: 63 MB of a newer release's unknown fields around a valid task.
    const padding = "x".repeat(63 * 1024 * 1024);
    await writeFile(
      join(await taskDir(home, "big-0-0-33333333"), "task.json"),
      stateText("big-1", "big", { padding }),
    );
    // S11: a forged id of 300 characters.
    await writeFile(
      join(await taskDir(home, "forged-0-0-44444444"), "task.json"),
      stateText("f".repeat(300), "forged"),
    );
    // S12: a symlinked task dir, another user's dir, a dir anyone may enter.
    elsewhere.dir = join(home, "elsewhere");
    await mkdir(elsewhere.dir);
    await writeFile(join(elsewhere.dir, "task.json"), stateText("linked-1", "linked"));
    await symlink(elsewhere.dir, join(home, "runners", "linked-0-0-55555555"));
    const other = await taskDir(home, "other-0-0-66666666");
    await writeFile(join(other, "task.json"), stateText("other-1", "other"));
    await chown(other, 65534, 65534);
    const wideDir = await taskDir(home, containerName(wide.name, wide.id));
    await writeFile(join(wideDir, "task.json"), stateText(wide.id, wide.name));
    await chmod(wideDir, 0o777);
    // S16: a newer release's task, without its container.
    newer.text = stateText(
      newer.id,
      newer.name,
      { status: "running", termination_reason: "", cleaned_up: false },
      2,
    );
    await writeFile(join(await taskDir(home, containerName(newer.name, newer.id)), "task.json"), newer.text);
    // S13: shim.log a FIFO nobody reads.
    execFileSync("mkfifo", [join(home, "shim.log")]);
    const t0 = performance.now();
    shim = await start({ home });
    startMs = performance.now() - t0;
  });

  it("S9 serves, with the FIFO and the /dev/zero symlink quarantined as they are, a note each", async () => {
    const found = await quarantined(home);
    expect(found.get("fifo-0-0-11111111")?.reason).toMatch(/task\.json is a FIFO, not a regular file$/);
    expect(found.get("zero-0-0-22222222")?.reason).toMatch(
      /task\.json is a symbolic link, not a regular file$/,
    );
    const zero = found.get("zero-0-0-22222222")?.entry ?? "";
    expect((await lstat(join(home, "quarantine", zero))).isSymbolicLink()).toBe(true);
    expect(startMs).toBeLessThan(15_000);
  });

  it("S10 quarantines the 63 MB task.json unread: its size in the note, the peak RSS far below the file", async () => {
    expect((await quarantined(home)).get("big-0-0-33333333")?.reason).toMatch(
      /task\.json is larger than 1 MiB \(66060\d{3} bytes\)$/,
    );
    const peak = peakRssMb(shim.child.pid ?? 0);
    console.log(`state-files: start ${Math.round(startMs)} ms, peak RSS ${Math.round(peak)} MB`);
    expect(peak).toBeLessThan(160);
  });

  it("S11 quarantines the forged id as corrupt, never loaded", async () => {
    expect((await quarantined(home)).get("forged-0-0-44444444")?.reason).toBe(
      `task state has an invalid id "${"f".repeat(64)}" (300 characters)`,
    );
    const ids = (await shim.request<{ tasks: { id: string }[] }>("GET", "/api/tasks")).json.tasks.map(
      (t) => t.id,
    );
    expect(ids.sort()).toEqual([newer.id, wide.id].sort());
  });

  it("S12 quarantines the symlinked dir (its target untouched) and another user's dir; narrows the 0777 one and says so", async () => {
    const found = await quarantined(home);
    expect(found.get("linked-0-0-55555555")?.entry).toMatch(/\.taskdir$/);
    expect(found.get("linked-0-0-55555555")?.reason).toBe(
      `task dir not entered: it is a symbolic link (to ${elsewhere.dir}), not a directory`,
    );
    expect(await readdir(elsewhere.dir)).toEqual(["task.json"]);
    expect(found.get("other-0-0-66666666")?.reason).toMatch(
      /^task dir not entered: it is owned by uid 65534/,
    );
    const wideDir = join(home, "runners", containerName(wide.name, wide.id));
    expect((await stat(wideDir)).mode & 0o777).toBe(0o700);
    expect(logged(shim, "task dir was wider than 0700; narrowed to 0700")).toEqual([
      expect.objectContaining({ dir: wideDir, mode: "0777" }),
    ]);
    expect((await shim.task(wide.id)).status).toBe("terminated");
  });

  it("S13 serves with shim.log a FIFO: never opened blocking, said on stderr, the FIFO left as it is", async () => {
    expect(shim.logs).toContain(
      `taskshim: cannot write ${join(home, "shim.log")} (${join(home, "shim.log")} is not a regular file)`,
    );
    expect((await lstat(join(home, "shim.log"))).isFIFO()).toBe(true);
    expect(logged(shim, "taskshim serving")).toHaveLength(1);
  });

  it("S16 lists the newer release's task read-only; a submit, terminate and remove of it answer 409; its file untouched", async () => {
    const shown = await shim.request<{ status: string; held?: { kind: string } }>(
      "GET",
      `/api/tasks/${newer.id}`,
    );
    expect([shown.status, shown.json.status, shown.json.held?.kind]).toEqual([
      200,
      "running",
      "newer-format",
    ]);
    const message = `request error: task ${newer.id} is held by a newer taskshim (task.json version 2): this release leaves it alone\n`;
    const submit = await shim.request("POST", "/api/tasks", {
      id: newer.id,
      name: newer.name,
      image_name: "busybox:1.36",
      command: ["true"],
    });
    const terminate = await shim.terminate(newer.id);
    const remove = await shim.remove(newer.id);
    for (const answer of [submit, terminate, remove])
      expect([answer.status, answer.text]).toEqual([409, message]);
    const file = join(home, "runners", containerName(newer.name, newer.id), "task.json");
    expect(await readFile(file, "utf8")).toBe(newer.text);
  });
});

describe("S14 a .taskshim-home-id that is a FIFO", () => {
  it("stops the start at once with one line naming it, exit 1, the lock released", async () => {
    const home = await newHome();
    const path = join(home, ".taskshim-home-id");
    execFileSync("mkfifo", [path]);
    const t0 = performance.now();
    const shim = await start({ home, waitReady: false });
    expect(await shim.waitExit(15_000)).toBe(1);
    expect(performance.now() - t0).toBeLessThan(10_000);
    const stderr = shim.logs
      .trim()
      .split("\n")
      .filter((l) => l.startsWith("taskshim:"));
    expect(stderr).toEqual([
      `taskshim: the home identity ${path} is a FIFO, not a regular file: restore it, or delete it to give this home a new identity`,
    ]);
    await rm(path);
    const again = await start({ home });
    await again.stop();
  });
});

describe("the task dirs read while the engine is reached", () => {
  it("a start the engine refuses has ended its scan (stale temp file swept) before it exits and frees the lock", async () => {
    const home = await newHome();
    const id = "scanned-task-1";
    const dir = await taskDir(home, containerName("scanned", id));
    await writeFile(join(dir, "task.json"), stateText(id, "scanned"));
    const stale = join(dir, ".task.json.tmp-4242");
    await writeFile(stale, "a write cut by a kill");
    const shim = await start({
      home,
      waitReady: false,
      env: { TASKSHIM_ENGINE_URL: `unix://${join(home, "no-engine.sock")}` },
    });
    expect(await shim.waitExit(15_000)).toBe(1);
    expect(shim.logs).toMatch(/docker engine unreachable/);
    // Only the scan deletes it, and the scan runs only under the lock: begun before the engine
    // answered (it never did), and waited for before the failed start let the lock go.
    await expect(stat(stale)).rejects.toMatchObject({ code: "ENOENT" });
    expect(await readFile(join(dir, "task.json"), "utf8")).toBe(stateText(id, "scanned"));
    const again = await start({
      home,
      waitReady: false,
      env: { TASKSHIM_ENGINE_URL: `unix://${join(home, "no-engine.sock")}` },
    });
    expect(await again.waitExit(15_000)).toBe(1);
    expect(again.logs).not.toMatch(/already running/);
  });
});

describe("S15 a quarantine that cannot take the corrupt file", () => {
  it("reports the failure (log, metrics, taskshim status), leaves the file, and a submit of its task answers 409", async () => {
    const home = await newHome();
    const id = "lost-task-1";
    const dir = await taskDir(home, containerName("lost", id));
    await writeFile(join(dir, "task.json"), "{damaged");
    await writeFile(join(home, "quarantine"), "a file where the quarantine dir should be");
    const shim = await start({ home });
    expect(
      logged(
        shim,
        "corrupt task state could not be quarantined: left in place and never written, until a human moves it",
      ),
    ).toEqual([expect.objectContaining({ level: 50, dir, reason: "task state is not valid JSON" })]);
    expect(logged(shim, "corrupt task state quarantined")).toEqual([]);
    const metrics = (await shim.request("GET", "/metrics")).text;
    expect(metrics).toMatch(/^taskshim_quarantine_failures_total 1$/m);
    expect(metrics).toMatch(/^taskshim_quarantined_state_files\{kind="quarantine-failed"\} 1$/m);
    const launch = bundleLaunch(bundle);
    const status = await exec(process.execPath, [...launch.flags, bundle, "status", "--shim", shim.url]);
    expect(status.stdout).toMatch(/^quarantined:\s+1 quarantine-failed$/m);
    const submit = await shim.request("POST", "/api/tasks", {
      id,
      name: "lost",
      image_name: "busybox:1.36",
      command: ["true"],
    });
    expect(submit.status).toBe(409);
    expect(submit.text).toMatch(
      /could not move to the quarantine .*: it is left as it is until a human moves it\n$/,
    );
    expect(await readFile(join(dir, "task.json"), "utf8")).toBe("{damaged");
  });
});

describe("A17 SIGTERM while the restore is held", () => {
  it("stops the start cleanly: exit 0, the lock released, and the next start serves", async () => {
    const home = await newHome();
    // A minute's delay, not `hang`: a restore stuck on real I/O keeps the process alive, and so
    // does the delay's timer (a promise that never settles would let the event loop run dry).
    const shim = await start({
      home,
      waitReady: false,
      env: { TASKSHIM_FAILPOINTS: "mid-restore=delay(60000)" },
    });
    const deadline = Date.now() + 15_000;
    while (!/"phase":"restoring"/.test(shim.logs) && Date.now() < deadline) await sleep(20);
    expect(shim.logs).toMatch(/"phase":"restoring"/);
    shim.child.kill("SIGTERM");
    expect(await shim.waitExit(10_000)).toBe(0);
    expect(
      logged(
        shim,
        "start interrupted; stopping before serving (containers keep running, the next start restores)",
      ),
    ).toEqual([expect.objectContaining({ by: "SIGTERM" })]);
    expect(logged(shim, "shim phase").map((l) => l.phase)).toEqual(["restoring", "draining", "stopped"]);
    const next = await start({ home });
    await next.stop();
  });
});
