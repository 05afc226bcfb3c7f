import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync } from "node:fs";
import { lstat, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AuthorizedKeys, passwdUserLookup } from "../src/host/authorized-keys.js";
import { makeHostKey } from "./support/chaos-host.js";

/*
 * Fault matrix row U2 (a host user races the shim's authorized_keys write): a real host user,
 * made here with useradd, swaps ~/.ssh for a symlink to an unrelated directory in a tight loop
 * while root reconciles that user's keys. The victim file must stay byte-identical.
 *
 * "Would have been caught" counts the attempts in which the swap landed inside the write: the
 * reconcile opened ~/.ssh as a real directory and succeeded, yet right after it ~/.ssh was the
 * symlink, so a write that renamed by path at the end (the old code) would have gone through it.
 */

const USER = `tskrace${randomBytes(3).toString("hex")}`;
const MIN_CONTESTED = 100;
const TIME_LIMIT_MS = 90_000;
const VICTIM_TEXT = "victim: a line nobody may change\n";

let base: string;
let home: string;
let uid: number;
let gid: number;
let loop: ChildProcess | undefined;

/** The swapping loop, run as the user: ~/.ssh is a directory, then a symlink, then a directory… */
const LOOP = `
const fs = require("fs");
const target = process.argv[1];
const pause = Number(process.argv[2]);
const cell = new Int32Array(new SharedArrayBuffer(4));
const sleep = (ms) => Atomics.wait(cell, 0, 0, ms);
for (;;) {
  sleep(pause);
  try { fs.renameSync(".ssh", ".ssh-real"); } catch {}
  try { fs.symlinkSync(target, ".ssh"); } catch {}
  sleep(pause);
  try { fs.unlinkSync(".ssh"); } catch {}
  try {
    fs.renameSync(".ssh-real", ".ssh");
  } catch {
    // The shim made a new ~/.ssh while none was there (as it should): drop it for the real one,
    // or every later rename fails and the loop stops swapping for good.
    if (fs.existsSync(".ssh-real")) {
      try { fs.rmSync(".ssh", { recursive: true, force: true }); fs.renameSync(".ssh-real", ".ssh"); } catch {}
    }
  }
}`;

/** Each state (a directory, a symlink) is held about `pauseMs`, so the swaps land inside writes. */
function startLoop(victimDir: string, pauseMs: number): ChildProcess {
  return spawn(process.execPath, ["-e", LOOP, victimDir, String(pauseMs)], {
    uid,
    gid,
    cwd: home,
    stdio: "ignore",
  });
}

async function stopLoop(): Promise<void> {
  if (!loop) return;
  const exited = new Promise((resolve) => loop?.once("exit", resolve));
  loop.kill("SIGKILL");
  await exited;
  loop = undefined;
}

/** Makes ~/.ssh a real directory again (the loop may have left it anywhere in its cycle). */
async function settleSshDir(): Promise<void> {
  const ssh = join(home, ".ssh");
  const info = await lstat(ssh).catch(() => undefined);
  if (info?.isSymbolicLink()) await rm(ssh);
  if (!(await lstat(ssh).catch(() => undefined)))
    await rename(join(home, ".ssh-real"), ssh).catch(() => mkdirSync(ssh, { mode: 0o700 }));
  execFileSync("chown", ["-R", `${uid}:${gid}`, ssh]);
}

async function victim(name: string): Promise<string> {
  const dir = join(base, name);
  mkdirSync(dir, { mode: 0o755 });
  await writeFile(join(dir, "authorized_keys"), VICTIM_TEXT);
  return dir;
}

/** The write as it was before: lstat-check ~/.ssh, then write a temp file and rename it by path. */
async function pathBasedWrite(key: string): Promise<void> {
  const ssh = join(home, ".ssh");
  const info = await lstat(ssh);
  if (info.isSymbolicLink()) throw new Error("symlink");
  const temp = join(ssh, "authorized_keys.tmp");
  await writeFile(temp, `${key}\n`, { flag: "wx" }).catch(() => undefined);
  await rename(temp, join(ssh, "authorized_keys"));
}

beforeAll(() => {
  base = mkdtempSync("/tmp/taskshim-race-");
  chmodSync(base, 0o755);
  home = join(base, "home");
  execFileSync("useradd", ["--home-dir", home, "--create-home", "--shell", "/bin/sh", USER]);
  uid = Number(execFileSync("id", ["-u", USER]).toString().trim());
  gid = Number(execFileSync("id", ["-g", USER]).toString().trim());
  mkdirSync(join(home, ".ssh"), { mode: 0o700 });
  execFileSync("chown", ["-R", `${uid}:${gid}`, home]);
});

afterAll(async () => {
  await stopLoop();
  try {
    execFileSync("userdel", ["--remove", USER], { stdio: "ignore" });
  } catch {
    // the user may already be gone
  }
  await rm(base, { recursive: true, force: true });
});

describe("H1 authorized_keys under a swapping ~/.ssh", () => {
  it("the race is real: a path-based write is redirected into the victim's directory", async () => {
    const victimDir = await victim("victim-path-based");
    loop = startLoop(victimDir, 0);
    let redirected = 0;
    const deadline = Date.now() + 20_000;
    while (redirected === 0 && Date.now() < deadline) {
      await pathBasedWrite(makeHostKey("path-based")).catch(() => undefined);
      if ((await readFile(join(victimDir, "authorized_keys"), "utf8")) !== VICTIM_TEXT) redirected++;
    }
    await stopLoop();
    await settleSshDir();
    expect(redirected).toBeGreaterThan(0);
  });

  it(`the shim's write leaves the victim byte-identical, ${MIN_CONTESTED}+ times the swap landed inside it`, async () => {
    const victimDir = await victim("victim-shim");
    const keys = new AuthorizedKeys(passwdUserLookup("/etc/passwd"));
    loop = startLoop(victimDir, 1);
    let attempts = 0;
    let contested = 0;
    let refused = 0;
    const started = Date.now();
    while (contested < MIN_CONTESTED && Date.now() - started < TIME_LIMIT_MS) {
      attempts++;
      let ok = true;
      await keys.reconcile(USER, [makeHostKey(`k${attempts}`)]).catch(() => {
        ok = false;
      });
      if (!ok) refused++;
      else if ((await lstat(join(home, ".ssh")).catch(() => undefined))?.isSymbolicLink()) contested++;
    }
    await stopLoop();
    console.log(
      `U2: ${attempts} reconciles in ${Date.now() - started} ms, ${contested} with the swap inside the write, ` +
        `${refused} refused (~/.ssh was the symlink or missing when opened); victim unchanged`,
    );
    expect(await readFile(join(victimDir, "authorized_keys"), "utf8")).toBe(VICTIM_TEXT);
    expect(await readdir(victimDir)).toEqual(["authorized_keys"]);
    expect(contested).toBeGreaterThanOrEqual(MIN_CONTESTED);
    // And the user's own file is still written correctly once the loop stops.
    await settleSshDir();
    const last = makeHostKey("final");
    await keys.reconcile(USER, [last]);
    expect(await readFile(join(home, ".ssh", "authorized_keys"), "utf8")).toContain(last.split(" ")[1]);
  });
});
