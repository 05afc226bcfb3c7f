import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { childExit, crashDelay, EXIT_CONFIG, supervise } from "./supervise.js";

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
    `#!/bin/sh\nn=$(( $(cat ${counter} 2>/dev/null || echo 0) + 1 ))\necho $n > ${counter}\ncase $n in\n${cases}\n  *) exit ${EXIT_CONFIG} ;;\nesac\n`,
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
