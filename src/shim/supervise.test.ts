import { chmod, copyFile, mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ROLLBACK_ENV } from "../lifecycle/rollback-report.js";
import { EXIT_CONFIG } from "../config/shim-config.js";
import { childExit, crashDelay, supervise } from "./supervise.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-supervise-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/**
 * A stand-in shim: a shell script that counts its runs in a file and ends run N the way
 * `endings[N-1]` says (`exit K` or `kill -KILL $$`).
 */
async function fakeShim(endings: readonly string[]): Promise<string> {
  const script = join(dir, "shim.sh");
  const counter = join(dir, "runs");
  const cases = endings.map((ending, i) => `  ${i + 1}) ${ending} ;;`).join("\n");
  await writeFile(
    script,
    // `serve --help` (the supervisor asks which flags a binary knows) is not a run.
    `#!/bin/sh\n[ "$2" = "--help" ] && exit 1\nn=$(( $(cat ${counter} 2>/dev/null || echo 0) + 1 ))\necho $n > ${counter}\ncase $n in\n${cases}\n  *) exit ${EXIT_CONFIG} ;;\nesac\n`,
  );
  await chmod(script, 0o755);
  return script;
}

interface Note {
  readonly time: string;
  readonly msg: string;
  readonly code?: number;
  readonly signal?: string;
  readonly delayMs?: number;
  readonly crashes?: number;
}

async function run(endings: readonly string[], stableAfterMs = 60_000) {
  const lines: string[] = [];
  const code = await supervise({
    binary: await fakeShim(endings),
    serveArgs: [],
    crashDelayMs: 10,
    maxCrashDelayMs: 40,
    stableAfterMs,
    handoffDelayMs: 1,
    log: (line) => lines.push(line),
  });
  return { code, notes: lines.map((l) => JSON.parse(l) as Note) };
}

describe("supervise", () => {
  it("backs off exponentially after crashes, capped, and stops for good on exit 78", async () => {
    const { code, notes } = await run(["exit 1", "exit 1", "exit 1", "exit 1", "exit 0", "exit 1"]);
    expect(code).toBe(EXIT_CONFIG);
    const restarts = notes.filter((n) => n.delayMs !== undefined);
    expect(restarts.map((n) => [n.code, n.delayMs])).toEqual([
      [1, 10],
      [1, 20],
      [1, 40],
      [1, 40],
      [0, 1],
      // A handoff (exit 0) starts the backoff over.
      [1, 10],
    ]);
    expect(notes.at(-1)?.msg).toMatch(/^shim refused its configuration; not restarting/);
    expect(notes.at(-1)?.code).toBe(78);
    expect(notes[0]?.time).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  });

  it("reports a killed child by signal name and 128+N", async () => {
    const { notes } = await run(["kill -KILL $$"]);
    expect(notes.find((n) => n.signal !== undefined)).toMatchObject({ signal: "SIGKILL", code: 137 });
  });

  it("resets the backoff after a stable run", async () => {
    // Every run counts as stable (0 ms): each crash is a first crash.
    const { notes } = await run(["exit 2", "exit 2", "exit 2"], 0);
    expect(notes.filter((n) => n.delayMs !== undefined).map((n) => n.delayMs)).toEqual([10, 10, 10]);
  });
});

describe("U12 supervise stops at once", () => {
  it("on SIGTERM during a crash backoff, without waiting out the delay", async () => {
    const lines: string[] = [];
    const stop = new AbortController();
    const began = performance.now();
    const code = await supervise({
      binary: await fakeShim(["exit 1", "exit 1"]),
      serveArgs: [],
      crashDelayMs: 60_000,
      maxCrashDelayMs: 60_000,
      stableAfterMs: 60_000,
      handoffDelayMs: 1,
      stop: stop.signal,
      log: (line) => {
        lines.push(line);
        if (line.includes("shim crashed; restarting")) stop.abort();
      },
    });
    expect(code).toBe(0);
    expect(performance.now() - began).toBeLessThan(5_000);
    expect(lines.map((l) => (JSON.parse(l) as Note).msg)).toEqual([
      "shim started",
      "shim crashed; restarting",
      "supervisor stopping",
    ]);
  });

  it("says once why it does not hold the API socket", async () => {
    const lines: string[] = [];
    await supervise({
      binary: await fakeShim([`exit ${EXIT_CONFIG}`]),
      serveArgs: [],
      crashDelayMs: 10,
      maxCrashDelayMs: 10,
      stableAfterMs: 60_000,
      handoffDelayMs: 1,
      notHolding: "port 10998 on 127.0.0.1 is in use (waited 30s for it)",
      log: (line) => lines.push(line),
    });
    const notes = lines.map((l) => JSON.parse(l) as Note & { why?: string });
    expect(notes.filter((n) => n.msg.startsWith("not holding the API socket"))).toEqual([
      expect.objectContaining({ why: "port 10998 on 127.0.0.1 is in use (waited 30s for it)" }),
    ]);
  });
});

describe("backoff arithmetic", () => {
  it("doubles per crash up to the cap", () => {
    const options = { crashDelayMs: 3_000, maxCrashDelayMs: 60_000 };
    expect([1, 2, 3, 4, 5, 6, 10].map((n) => crashDelay(n, options))).toEqual([
      3_000, 6_000, 12_000, 24_000, 48_000, 60_000, 60_000,
    ]);
  });

  it("turns exit events into codes", () => {
    expect(childExit(3, null)).toEqual({ code: 3 });
    expect(childExit(null, "SIGTERM")).toEqual({ code: 143, signal: "SIGTERM" });
  });
});

/**
 * A stand-in shim in Node (it can say "serving" on the IPC channel as taskshim does): its
 * `serve --help` lists `helpFlags` the way commander prints them, each run appends its arguments
 * and its rollback variable to `runs.log`, says it serves, and exits 0 once `exit-now` appears.
 */
async function servingShim(helpFlags: readonly string[] = ["--shim-home <dir>"]): Promise<string> {
  const script = join(dir, "good.js");
  const help = ["Usage: taskshim serve [options]", "", "Options:"]
    .concat(
      helpFlags.map((f) => `  ${f.padEnd(30)}some help [env`, "                                  SOME_VAR]"),
    )
    .concat(["  -h, --help                      display help for command", ""])
    .join("\n");
  await writeFile(
    script,
    `#!${process.execPath}
const fs = require("node:fs");
const dir = ${JSON.stringify(dir)};
if (process.argv.includes("--help")) { process.stdout.write(${JSON.stringify(help)}); process.exit(0); }
fs.appendFileSync(dir + "/runs.log", JSON.stringify({ args: process.argv.slice(2), rollback: process.env.${ROLLBACK_ENV} ?? null }) + "\\n");
process.send({ taskshim: "serving" });
process.on("SIGTERM", () => process.exit(0));
setInterval(() => { try { fs.unlinkSync(dir + "/exit-now"); process.exit(0); } catch {} }, 20);
`,
  );
  await chmod(script, 0o755);
  return script;
}

const runsOf = async (): Promise<{ args: string[]; rollback: string | null }[]> =>
  (await readFile(join(dir, "runs.log"), "utf8").catch(() => ""))
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { args: string[]; rollback: string | null });

async function until(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 10_000) {
  const began = performance.now();
  while (!(await check())) {
    if (performance.now() - began > timeoutMs) throw new Error(`timed out: ${what}`);
    await sleep(20);
  }
}

/**
 * Starts a supervisor on a serving shim installed at `bin/taskshim`, waits until it kept it as
 * `.previous`, then renames `bad` over it (as an install does) and has the good shim exit 0 (the
 * upgrade's handoff): the supervisor starts the bad binary next.
 */
async function rollOutBad(bad: string, serveWithinMs = 10_000) {
  const good = await servingShim();
  await mkdir(join(dir, "bin"));
  const binary = join(dir, "bin", "taskshim");
  await copyFile(good, binary);
  await chmod(binary, 0o755);
  const goodBytes = await readFile(binary);
  const lines: string[] = [];
  const stop = new AbortController();
  const supervising = supervise({
    binary,
    serveArgs: [],
    crashDelayMs: 10,
    maxCrashDelayMs: 10,
    stableAfterMs: 60_000,
    handoffDelayMs: 1,
    serveWithinMs,
    stop: stop.signal,
    log: (line) => lines.push(line),
  });
  await until(() => lines.some((l) => l.includes("kept the binary that serves")), "the good binary kept");
  await writeFile(join(dir, "bad.tmp"), bad, { mode: 0o755 });
  await rename(join(dir, "bad.tmp"), binary);
  const began = performance.now();
  await writeFile(join(dir, "exit-now"), "");
  await until(async () => (await runsOf()).length >= 2, "the previous binary back", serveWithinMs + 10_000);
  const tookMs = performance.now() - began;
  stop.abort();
  const code = await supervising;
  return { binary, goodBytes, lines, notes: lines.map((l) => JSON.parse(l) as Note), tookMs, code };
}

describe("U16 a new binary that never serves is rolled back under supervise", () => {
  it("exits 78 before serving: the previous binary is put back and restarted, and says why", async () => {
    const { binary, goodBytes, notes, code } = await rollOutBad(`#!/bin/sh\nexit ${EXIT_CONFIG}\n`);
    expect(code).toBe(0);
    expect(await readFile(binary)).toEqual(goodBytes);
    expect(await readFile(`${binary}.previous`)).toEqual(goodBytes);
    const rolled = notes.filter((n) => n.msg === "the new binary failed; rolled back to the previous one");
    expect(rolled).toHaveLength(1);
    expect(rolled[0]).toMatchObject({
      code: 78,
      reason: expect.stringMatching(/^exited 78 before serving/) as unknown,
    });
    expect(notes.map((n) => n.msg)).not.toContain(
      "shim refused its configuration; not restarting (fix it, then start again)",
    );
    // The restarted previous binary is told, for its healthcheck.
    const runs = await runsOf();
    expect(runs[0]?.rollback).toBeNull();
    expect(JSON.parse(runs[1]?.rollback ?? "{}")).toMatchObject({
      binary,
      reason: expect.stringMatching(/^exited 78 before serving/) as unknown,
    });
  });

  it("does not serve within the bound: it is stopped and the previous binary put back", async () => {
    const { binary, goodBytes, notes, tookMs } = await rollOutBad(
      `#!/bin/sh\n[ "$2" = "--help" ] && exit 1\nexec sleep 600\n`,
      1_000,
    );
    expect(await readFile(binary)).toEqual(goodBytes);
    expect(notes.find((n) => n.msg.startsWith("the new binary failed"))).toMatchObject({
      reason: "did not serve within 1s",
    });
    expect(tookMs).toBeLessThan(5_000);
  });
});

describe("U17 serve flags a binary does not know", () => {
  it("are left out, named in one line, and the rest passed on", async () => {
    const good = await servingShim(["--shim-home <dir>", "--shim-http-port <port>"]);
    const lines: string[] = [];
    const stop = new AbortController();
    const supervising = supervise({
      binary: good,
      serveArgs: [
        "--log-format",
        "json",
        "--shim-home",
        "/h",
        "--max-event-streams=5",
        "--privileged",
        "--shim-http-port",
        "1234",
      ],
      crashDelayMs: 10,
      maxCrashDelayMs: 10,
      stableAfterMs: 60_000,
      handoffDelayMs: 1,
      stop: stop.signal,
      log: (line) => lines.push(line),
    });
    await until(async () => (await runsOf()).length >= 1, "a run");
    stop.abort();
    await supervising;
    expect((await runsOf())[0]?.args).toEqual(["serve", "--shim-home", "/h", "--shim-http-port", "1234"]);
    const dropped = lines.map((l) => JSON.parse(l) as Note & { dropped?: string[] }).filter((n) => n.dropped);
    expect(dropped).toEqual([
      expect.objectContaining({
        msg: "this binary does not know some serve flags; not passing them",
        dropped: ["--log-format", "--max-event-streams", "--privileged"],
      }),
    ]);
  });
});

describe("U16 a binary missing from its path under supervise", () => {
  it("cannot start, and the kept one is put back and started", async () => {
    const good = await servingShim();
    await mkdir(join(dir, "bin"));
    const binary = join(dir, "bin", "taskshim");
    await copyFile(good, binary);
    await chmod(binary, 0o755);
    const lines: string[] = [];
    const stop = new AbortController();
    const supervising = supervise({
      binary,
      serveArgs: [],
      crashDelayMs: 10,
      maxCrashDelayMs: 10,
      stableAfterMs: 60_000,
      handoffDelayMs: 1,
      stop: stop.signal,
      log: (line) => lines.push(line),
    });
    await until(() => lines.some((l) => l.includes("kept the binary that serves")), "the binary kept");
    await rm(binary);
    await writeFile(join(dir, "exit-now"), "");
    await until(async () => (await runsOf()).length >= 2, "the kept binary back");
    stop.abort();
    await supervising;
    const notes = lines.map((l) => JSON.parse(l) as Note & { reason?: string });
    expect(notes.map((n) => n.msg)).toContain("shim could not start");
    expect(notes.find((n) => n.msg.startsWith("the new binary failed"))).toMatchObject({ code: 127 });
    expect(await readFile(binary, "utf8")).toBe(await readFile(good, "utf8"));
  });
});
