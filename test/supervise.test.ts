import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { ARENA_ENV, MALLOC_ARENAS } from "../src/shim/glibc-malloc.js";
import { alive } from "./support/dockerd.js";
import { bundleLaunch, bundleNodeFlags, freePort, SHIM_BUNDLE, tempHome } from "./support/shim-process.js";

/*
 * `taskshim supervise` killed and started again, and stopped during a backoff (docs/operations.md,
 * "Without systemd"). A supervisor SIGKILLed leaves its inner supervisor and its shim behind; they
 * shut down by themselves, and the next supervisor waits for the port instead of crash-looping on it.
 */

interface Supervisor {
  readonly child: ChildProcess;
  output: string;
}

const started: Supervisor[] = [];

afterAll(async () => {
  for (const s of started) {
    if (s.child.exitCode === null && s.child.signalCode === null) {
      s.child.kill("SIGTERM");
      await Promise.race([once(s.child, "exit"), sleep(30_000)]);
    }
  }
});

function superviseProcess(args: readonly string[]): Supervisor {
  const child = spawn(process.execPath, [...bundleNodeFlags(), SHIM_BUNDLE, "supervise", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const s: Supervisor = { child, output: "" };
  child.stdout?.on("data", (c: Buffer) => (s.output += c.toString()));
  child.stderr?.on("data", (c: Buffer) => (s.output += c.toString()));
  started.push(s);
  return s;
}

/** Every descendant of `pid` (from /proc's children lists). */
function descendants(pid: number): number[] {
  let children: number[];
  try {
    children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8")
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
  } catch {
    return [];
  }
  return children.flatMap((child) => [child, ...descendants(child)]);
}

async function healthcheck(port: number): Promise<number> {
  const answer = await fetch(`http://127.0.0.1:${port}/api/healthcheck`, {
    signal: AbortSignal.timeout(5_000),
  });
  await answer.text();
  return answer.status;
}

async function until(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 60_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

describe("taskshim supervise, killed and stopped", () => {
  it("U11 a new supervisor after a SIGKILLed one waits for the orphaned shim instead of crash-looping on the port, then holds the socket", async () => {
    const port = await freePort();
    const home = await tempHome("taskshim-orphan-");
    const args = ["--crash-delay", "200ms", "--", "--shim-home", home, "--shim-http-port", String(port)];
    const first = superviseProcess(args);
    await until("the first shim", async () => (await healthcheck(port).catch(() => 0)) === 200);
    const orphans = descendants(first.child.pid!);
    expect(orphans.length).toBeGreaterThanOrEqual(2); // the inner supervisor and its shim
    // The shim runs with the arena cap of every launch path (scripts/node-flags.mjs).
    const cmdline = (pid: number): string[] => readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    const shim = orphans.find((pid) => cmdline(pid).includes("serve"));
    expect(shim, "the supervised shim's process").toBeDefined();
    expect(readFileSync(`/proc/${shim}/environ`, "utf8").split("\0")).toContain(
      `${ARENA_ENV}=${MALLOC_ARENAS}`,
    );
    // …and the bundle's shebang (scripts/node-flags.mjs) the same value as `serve` and supervise.
    expect(bundleLaunch(SHIM_BUNDLE).env[ARENA_ENV]).toBe(String(MALLOC_ARENAS));
    first.child.kill("SIGKILL");
    await once(first.child, "exit");

    const next = superviseProcess(args);
    await until("the next supervisor's shim", () => /"msg":"taskshim serving"/.test(next.output));
    // The orphans ended by themselves (the inner supervisor stopped its shim gracefully).
    await until("the orphans to exit", () => orphans.every((pid) => !alive(pid)), 30_000);
    expect(next.output).not.toMatch(/already in use|not holding the API socket|shim crashed/);

    // It holds the socket: a restart (exit 0, the next shim) refuses no request of a poller.
    let refused = 0;
    let answered = 0;
    let polling = true;
    const poller = (async () => {
      while (polling) {
        if ((await healthcheck(port).catch(() => 0)) === 200) answered++;
        else refused++;
        await sleep(20);
      }
    })();
    const shimsBefore = (next.output.match(/"msg":"shim started"/g) ?? []).length;
    const shutdown = await fetch(`http://127.0.0.1:${port}/api/shutdown`, {
      method: "POST",
      body: "{}",
      headers: { "content-type": "application/json" },
    });
    expect(shutdown.status).toBe(200);
    await until(
      "the restarted shim",
      () => (next.output.match(/"msg":"taskshim serving"/g) ?? []).length >= 2 && shimsBefore >= 1,
    );
    await sleep(300);
    polling = false;
    await poller;
    expect(refused).toBe(0);
    console.log(
      `supervisor SIGKILLed: the next one held the socket; ${answered} polls answered, ${refused} refused`,
    );
  });

  it("U12 exits at once on SIGTERM during a crash backoff", async () => {
    const port = await freePort();
    const s = superviseProcess([
      "--binary",
      "/bin/false",
      "--crash-delay",
      "60s",
      "--",
      "--shim-http-port",
      String(port),
    ]);
    await until("a crash", () => s.output.includes("shim crashed; restarting"), 20_000);
    const began = performance.now();
    s.child.kill("SIGTERM");
    const [code] = (await once(s.child, "exit")) as [number | null];
    const tookMs = performance.now() - began;
    expect(code).toBe(0);
    expect(tookMs).toBeLessThan(2_000);
  });
});
