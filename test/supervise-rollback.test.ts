import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { once } from "node:events";
import { chmod, copyFile, mkdir, readFile, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { releaseBinary } from "./support/releases.js";
import { bundleNodeFlags, freePort, SHIM_BUNDLE, tempHome } from "./support/shim-process.js";

/*
 * Upgrades that roll themselves back (docs/fault-matrix.md U16 to U20), end to end on the built
 * shim under its own `taskshim supervise`, with today's serve flags: a new binary that exits 78,
 * one that never serves (and the held socket answering 503 meanwhile), one that claims the running
 * build, two upgrades at once, and a rollback to the first release, 1.0.0, which knows none of
 * --log-format, --engine-url and --max-event-streams.
 */

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");
const t0 = performance.now();
const step = (what: string): void =>
  console.log(`supervise rollback: ${what} at ${Math.round(performance.now() - t0)} ms`);

interface Health {
  version: string;
  build?: { build_id: string };
  rollback?: { at: string; reason: string; binary: string };
}
interface Result {
  outcome: string;
  error?: string;
  to: string;
  tasksKept: number | null;
}

let work: string;
let installed: string;
let original: Buffer;
let running: { version: string; build_id: string };
let url = "";
let supervisor: ChildProcess | undefined;
let log = "";
let slow: Server | undefined;

async function health(): Promise<{ status: number; json: Health | undefined; text: string }> {
  const response = await fetch(`${url}/api/healthcheck`, {
    headers: { connection: "close" },
    signal: AbortSignal.timeout(5_000),
  });
  const text = await response.text();
  return {
    status: response.status,
    json: response.status === 200 ? (JSON.parse(text) as Health) : undefined,
    text,
  };
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const began = performance.now();
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (performance.now() - began > timeoutMs)
      throw new Error(`${what}: not within ${timeoutMs} ms\n${log.slice(-4000)}`);
    await sleep(50);
  }
}

const serving = (): Promise<Health> =>
  until("the API", async () => {
    const answer = await health();
    return answer.status === 200 ? answer.json : undefined;
  });

const sha256 = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");

/** `taskshim upgrade --json` of the build under test to `binaryUrl`: its result and exit code. */
async function upgrade(binaryUrl: string, sha: string): Promise<{ result: Result; code: number }> {
  const argv = [SHIM_BUNDLE, "upgrade", "--shim", url, "--url", binaryUrl, "--sha256", sha, "--json"];
  const ran = await exec(process.execPath, argv, { timeout: 180_000 }).then(
    ({ stdout }) => ({ stdout, code: 0 }),
    (error: { stdout?: string; code?: number }) => ({ stdout: error.stdout ?? "", code: error.code ?? -1 }),
  );
  const [result] = JSON.parse(ran.stdout) as Result[];
  if (result === undefined) throw new Error(`no result: ${ran.stdout}`);
  return { result, code: ran.code };
}

/** A fake taskshim: answers `--version` and `version --json` as `version`/`buildId`, then `body`. */
async function fake(name: string, version: string, buildId: string, body: string): Promise<string> {
  const path = join(work, name);
  await writeFile(
    path,
    `#!/bin/sh
[ "$1" = "--version" ] && { echo "taskshim version ${version}"; exit 0; }
[ "$1" = "version" ] && { echo '{"version":"${version}","build_id":"${buildId}"}'; exit 0; }
${body}
`,
  );
  await chmod(path, 0o755);
  return path;
}

async function upgradeTo(path: string): Promise<{ result: Result; code: number }> {
  return upgrade(`file://${path}`, sha256(await readFile(path)));
}

beforeAll(async () => {
  work = await tempHome("taskshim-rollback-");
  await mkdir(join(work, "bin"));
  installed = join(work, "bin", "taskshim");
  await copyFile(SHIM_BUNDLE, installed);
  await chmod(installed, 0o755);
  original = await readFile(installed);
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  supervisor = spawn(
    process.execPath,
    [
      ...bundleNodeFlags(),
      SHIM_BUNDLE,
      "supervise",
      "--binary",
      installed,
      "--serve-within",
      "4s",
      "--refuse-after",
      "1s",
      "--",
      "--shim-home",
      join(work, "home"),
      "--shim-http-port",
      String(port),
      "--shim-binary-path",
      installed,
      // Today's flags, which the first release does not know.
      "--log-format",
      "json",
      "--max-event-streams",
      "8",
      "--engine-url",
      "unix:///var/run/docker.sock",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  supervisor.stdout?.on("data", (c: Buffer) => (log += c.toString()));
  supervisor.stderr?.on("data", (c: Buffer) => (log += c.toString()));
  const first = await serving();
  running = { version: first.version, build_id: first.build?.build_id ?? "" };
  expect(running.build_id).toMatch(/^[0-9a-f]{20}$/);
}, 180_000);

afterAll(async () => {
  if (supervisor && supervisor.exitCode === null) {
    supervisor.kill("SIGTERM");
    await Promise.race([once(supervisor, "exit"), sleep(30_000)]);
  }
  slow?.close();
});

describe("upgrades that roll themselves back under supervise", () => {
  it("U18 a binary that prints the running build id is already current, and nothing is installed", async () => {
    const before = await serving();
    const claims = await fake("claims", running.version, running.build_id, "exec sleep 600");
    const { result, code } = await upgradeTo(claims);
    expect(result).toMatchObject({ outcome: "already-current" });
    expect(code).toBe(0);
    expect(sha256(await readFile(installed))).toBe(sha256(original));
    expect(await serving()).toEqual(before);
    expect(log).not.toMatch(/"msg":"shim exited; restarting"/);
    step("already-current");
  });

  it("U16 a binary that exits 78 before serving is rolled back: the API is back, the old binary on disk", async () => {
    const exits = await fake("exits78", "9.9.9", "99999999999999999999", "exit 78");
    const { result, code } = await upgradeTo(exits);
    expect(result).toMatchObject({
      outcome: "rolled-back",
      to: "9.9.9",
      tasksKept: 0,
      error: expect.stringMatching(
        /^rolled back by the shim's supervisor: the new binary exited 78 before serving/,
      ) as unknown,
    });
    expect(code).toBe(1);
    const back = await serving();
    expect(back.build?.build_id).toBe(running.build_id);
    expect(back.rollback).toMatchObject({ binary: installed });
    expect(sha256(await readFile(installed))).toBe(sha256(original));
    expect(log.match(/"msg":"the new binary failed; rolled back to the previous one"/g)).toHaveLength(1);
    expect(log).not.toMatch(/not restarting/);
    const status = JSON.parse(
      (await exec(process.execPath, [SHIM_BUNDLE, "status", "--shim", url, "--json"])).stdout,
    ) as { rollback?: { reason: string } };
    expect(status.rollback?.reason).toMatch(/^exited 78 before serving/);
    step("exit 78 rolled back");
  });

  it("U16 U20 a binary that never serves is rolled back after --serve-within; meanwhile the held socket answers 503 at once", async () => {
    const hangs = await fake("hangs", "9.9.8", "98989898989898989898", "exec sleep 600");
    const exits = (): number => (log.match(/"msg":"shim exited; restarting"/g) ?? []).length;
    const exitsBefore = exits();
    const trials = (): number => (log.match(/"trial":true/g) ?? []).length;
    const trialsBefore = trials();
    const rollout = upgradeTo(hangs);
    await until("the old shim's exit", () => Promise.resolve(exits() > exitsBefore ? true : undefined));
    // No shim serves from here. A request made now is answered 503 in one plain-text line once
    // --refuse-after (1s) has passed, never held in the backlog for the trial's 4 s or more.
    const asked = performance.now();
    const first = await health();
    const firstMs = performance.now() - asked;
    expect(first.status).toBe(503);
    expect(first.text).toBe("no shim is serving: it is restarting or failed to start; try again\n");
    expect(firstMs).toBeLessThan(3_000);
    // While the new binary is on trial (it never serves), every request is answered at once.
    await until("the new binary's start", () => Promise.resolve(trials() > trialsBefore ? true : undefined));
    const during = performance.now();
    expect((await health()).status).toBe(503);
    const duringMs = performance.now() - during;
    expect(duringMs).toBeLessThan(1_000);
    const { result } = await rollout;
    expect(result).toMatchObject({
      outcome: "rolled-back",
      error: "rolled back by the shim's supervisor: the new binary did not serve within 4s",
    });
    expect((await serving()).build?.build_id).toBe(running.build_id);
    expect(sha256(await readFile(installed))).toBe(sha256(original));
    console.log(
      `never serves: a request made as the old shim exited answered 503 after ${Math.round(firstMs)} ms; one during the trial after ${Math.round(duringMs)} ms`,
    );
    step("never-serving rolled back");
  });

  it("U17 U19 rolls back to 1.0.0 with today's flags left out; of two upgrades at once one upgrades, the other is refused; and forward again", async () => {
    const releases = (
      JSON.parse(await readFile(join(ROOT, "releases.json"), "utf8")) as {
        releases: { version: string; commit: string }[];
      }
    ).releases;
    const first = releases.find((r) => r.version === "1.0.0");
    if (first === undefined) throw new Error("releases.json lists no 1.0.0");
    const binary = await readFile(await releaseBinary(first));
    step("1.0.0 built");
    // Served slowly, so that the second upgrade's install arrives while the first one's runs.
    slow = createServer((request, response) => {
      void sleep(1_500).then(() => response.writeHead(200).end(binary));
    });
    slow.listen(0, "127.0.0.1");
    await once(slow, "listening");
    const from = `http://127.0.0.1:${(slow.address() as AddressInfo).port}/taskshim-1.0.0`;
    const both = await Promise.all([upgrade(from, sha256(binary)), upgrade(from, sha256(binary))]);
    const outcomes = both.map((b) => b.result.outcome).sort();
    expect(outcomes, JSON.stringify(both)).toEqual(["refused", "upgraded"]);
    const refusal = both.find((b) => b.result.outcome === "refused");
    expect(refusal?.result.error).toBe("refused: another upgrade is in progress (the shim is installing)");
    expect(refusal?.result.tasksKept).toBeNull();
    expect(refusal?.code).toBe(1);
    const old = await serving();
    expect(old.version).toBe("1.0.0");
    expect(old.build).toBeUndefined();
    const dropped =
      /"msg":"this binary does not know some serve flags; not passing them","dropped":(\[[^\]]*\])/.exec(log);
    expect(JSON.parse(dropped?.[1] ?? "[]")).toEqual(["--log-format", "--max-event-streams", "--engine-url"]);
    expect(log).not.toMatch(/not restarting/);
    step("rolled back to 1.0.0");

    // Forward again with the same command: the build under test gets every flag back.
    const { result } = await upgradeTo(SHIM_BUNDLE);
    expect(result).toMatchObject({ outcome: "upgraded" });
    expect((await serving()).build?.build_id).toBe(running.build_id);
    step("forward again");
  });
});
