import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { chmod, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { waitFor } from "../testing/wait-for.js";
import { EXPORTER_WRAPPER } from "./exporter-process.js";
import { ExporterSupervisor, type ExporterTimings } from "./exporter-supervisor.js";
import { ExporterUnavailableError, MetricsFetchError } from "./ports.js";
import { EXPORTER_PID_FILE } from "./stale-exporter.js";
import { exporterText, fakeExporterScript } from "./test-support.js";

/*
 * The supervisor against a fake DCGM Exporter: a real process (Node running test-support's
 * script) serving exporter text on a real port, started, killed, hung and stopped for real.
 */

const FAST: Partial<ExporterTimings> = {
  readyMs: 3_000,
  readyPollMs: 20,
  backoffBaseMs: 20,
  backoffMaxMs: 160,
  stopGraceMs: 400,
  fetchTimeoutMs: 2_000,
};

let dir: string;
let executable: string;
let startsLog: string;
let port: number;
const running: { shutdown: AbortController; done: Promise<void> }[] = [];

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return typeof address === "object" && address !== null ? address.port : 0;
}

/** Running, not a zombie (this machine's init may not reap what is reparented to it). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** The starts the fake recorded: its pid and arguments each time. */
async function starts(): Promise<{ pid: number; args: string[] }[]> {
  const text = await readFile(startsLog, "utf8").catch(() => "");
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { pid: number; args: string[] });
}

function logSink() {
  const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
  return {
    lines,
    log: (level: string, fields: Record<string, unknown>, msg: string) => lines.push({ level, msg, fields }),
    messages: () => lines.map((l) => l.msg),
  };
}

function start(supervisor: ExporterSupervisor) {
  const shutdown = new AbortController();
  const done = supervisor.run(shutdown.signal);
  running.push({ shutdown, done });
  return { shutdown, done };
}

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-exporter-"));
  executable = join(dir, "dcgm-exporter");
  await writeFile(executable, fakeExporterScript(process.execPath));
  await chmod(executable, 0o755);
  startsLog = join(dir, "starts.jsonl");
  port = await freePort();
  process.env.FAKE_EXPORTER_LOG = startsLog;
});

afterEach(async () => {
  for (const r of running.splice(0)) {
    r.shutdown.abort();
    await r.done;
  }
  // Deleted, not replaced: a child spawned without `env` gets the process's real environment.
  for (const key of Object.keys(process.env)) if (key.startsWith("FAKE_EXPORTER_")) delete process.env[key];
  for (const s of await starts()) if (alive(s.pid)) process.kill(s.pid, "SIGKILL");
  await rm(dir, { recursive: true, force: true });
});

function supervisor(log = logSink(), timings: Partial<ExporterTimings> = FAST, intervalMs = 1_000) {
  return new ExporterSupervisor({ executable, port, intervalMs, home: dir, log: log.log, timings });
}

describe("ExporterSupervisor", () => {
  it("starts DCGM Exporter with dstack-shim's arguments and serves its answer once /metrics answers", async () => {
    const log = logSink();
    const exporter = supervisor(log, FAST, 5_000);
    start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000, what: "serving" });
    const [first] = await starts();
    expect(first?.args.slice(0, 1)).toEqual(["-f"]);
    expect(first?.args.slice(2)).toEqual(["-a", `localhost:${port}`, "-c", "5000"]);
    // The counters file exists while it runs, with dstack-shim's fields.
    const counters = await readFile(first?.args[1] ?? "", "utf8");
    expect(counters.split("\n")[0]).toBe("DCGM_FI_DEV_GPU_UTIL,gauge,GPU utilization (%).");
    expect(counters).toContain("DCGM_FI_DEV_XID_ERRORS,gauge,");
    await expect(exporter.exposition(new AbortController().signal)).resolves.toBe(exporterText());
    // The pid file names the wrapper's group, for the next start's cleanup.
    const record = JSON.parse(await readFile(join(dir, EXPORTER_PID_FILE), "utf8")) as { pgid: number };
    expect(record).toEqual({
      pgid: exporter.state().kind === "serving" ? record.pgid : -1,
      executable,
      port,
    });
    expect(record.pgid).toBeGreaterThan(1);
    expect(log.messages()).toContain("DCGM Exporter serving");
  });

  it("serves a cached answer within the collect interval, as dstack-shim", async () => {
    const sink = logSink();
    const exporter = supervisor(sink, FAST, 60_000);
    start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000 });
    const signal = new AbortController().signal;
    const first = await exporter.exposition(signal);
    // The exporter is gone from the port (SIGSTOP: it cannot answer), yet the cached answer is served.
    const [s] = await starts();
    process.kill(s?.pid ?? 0, "SIGSTOP");
    try {
      await expect(exporter.exposition(signal)).resolves.toBe(first);
    } finally {
      process.kill(s?.pid ?? 0, "SIGCONT");
    }
  });

  it("starts it again, after a backoff, when it dies; a fetch meanwhile is a MetricsFetchError (502)", async () => {
    const log = logSink();
    const exporter = supervisor(log);
    start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000 });
    const [first] = await starts();
    process.kill(first?.pid ?? 0, "SIGKILL");
    await waitFor(() => exporter.state().kind !== "serving", { timeoutMs: 2_000 });
    await expect(exporter.exposition(new AbortController().signal)).rejects.toBeInstanceOf(MetricsFetchError);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000, what: "serving again" });
    const all = await starts();
    expect(all).toHaveLength(2);
    expect(all[1]?.pid).not.toBe(first?.pid);
    expect(log.messages()).toContain("DCGM Exporter exited; starting it again");
    await expect(exporter.exposition(new AbortController().signal)).resolves.toBe(exporterText());
  });

  it("doubles the backoff while it keeps failing, up to the maximum", { timeout: 30_000 }, async () => {
    process.env.FAKE_EXPORTER_FAIL = "1";
    const log = logSink();
    const exporter = supervisor(log);
    const delays = new Map<number, number>();
    start(exporter);
    await waitFor(
      () => {
        const state = exporter.state();
        if (state.kind === "backoff") delays.set(state.attempt, state.delayMs);
        return delays.size >= 5;
      },
      { timeoutMs: 25_000, intervalMs: 1 },
    );
    expect([...delays.keys()]).toEqual([1, 2, 3, 4, 5]);
    expect([...delays.values()]).toEqual([20, 40, 80, 160, 160]);
    expect(
      log.lines.find((l) => l.msg === "DCGM Exporter exited before it served; starting it again")?.fields,
    ).toEqual(expect.objectContaining({ code: 3, last: "fake: failing at start" }));
  });

  it("bounds the start: one that never answers /metrics is killed and started again", async () => {
    process.env.FAKE_EXPORTER_DELAY_MS = "600000";
    const log = logSink();
    const exporter = supervisor(log, { ...FAST, readyMs: 300 });
    start(exporter);
    await waitFor(
      () => log.messages().filter((m) => m.startsWith("DCGM Exporter did not answer")).length >= 2,
      {
        timeoutMs: 5_000,
      },
    );
    const all = await starts();
    expect(all.length).toBeGreaterThanOrEqual(2);
    // The first attempt is gone: killed before the second was started.
    expect(alive(all[0]?.pid ?? 0)).toBe(false);
  });

  it("stops it with SIGTERM at shutdown, and removes its pid file; run() resolves", async () => {
    const exporter = supervisor();
    const { shutdown, done } = start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000 });
    const [first] = await starts();
    shutdown.abort();
    await done;
    expect(alive(first?.pid ?? 0)).toBe(false);
    expect(exporter.state().kind).toBe("stopped");
    await expect(readFile(join(dir, EXPORTER_PID_FILE))).rejects.toThrow();
  });

  it("kills one that ignores SIGTERM after the grace", async () => {
    process.env.FAKE_EXPORTER_IGNORE_TERM = "1";
    const log = logSink();
    const exporter = supervisor(log);
    const { shutdown, done } = start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000 });
    const [first] = await starts();
    const startedAt = performance.now();
    shutdown.abort();
    await done;
    const elapsed = performance.now() - startedAt;
    expect(alive(first?.pid ?? 0)).toBe(false);
    expect(elapsed).toBeGreaterThanOrEqual(350);
    expect(elapsed).toBeLessThan(3_000);
    expect(log.messages()).toContain("DCGM Exporter ignored SIGTERM; killing it");
  });

  it("does not run at all when its version check fails: the route answers as without an exporter", async () => {
    const log = logSink();
    const exporter = new ExporterSupervisor({
      executable,
      port,
      intervalMs: 1_000,
      home: dir,
      log: log.log,
      timings: FAST,
      versionCheck: () => Promise.reject(new Error("dcgm-exporter -v: exit status 1")),
    });
    await start(exporter).done;
    expect(await starts()).toEqual([]);
    await expect(exporter.exposition(new AbortController().signal)).rejects.toBeInstanceOf(
      ExporterUnavailableError,
    );
    expect(log.messages()).toEqual(["not using DCGM Exporter: its version check failed"]);
  });

  it("kills an exporter an earlier shim left on its port before starting its own", async () => {
    // An exporter left behind, as dstack-shim or a SIGKILLed wrapper leaves it: no parent that watches it.
    const stale = spawn(executable, ["-f", "/tmp/counters-1.csv", "-a", `localhost:${port}`, "-c", "1000"], {
      detached: true,
      stdio: "ignore",
    });
    stale.unref();
    await waitFor(() => false, { timeoutMs: 0 }).catch(() => undefined);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const log = logSink();
    const exporter = supervisor(log);
    start(exporter);
    await waitFor(() => exporter.state().kind === "serving", { timeoutMs: 5_000 });
    expect(alive(stale.pid ?? 0)).toBe(false);
    expect(
      log.lines.find((l) => l.msg === "stopped a DCGM Exporter left by an earlier shim")?.fields,
    ).toEqual(expect.objectContaining({ pids: [stale.pid] }));
  });
});

describe("the exporter's wrapper", () => {
  it("ends the exporter when its stdin closes, as when the shim that holds the pipe dies", async () => {
    const wrapper = spawn(
      "/bin/sh",
      ["-c", EXPORTER_WRAPPER, "wrapper", executable, "-a", `localhost:${port}`],
      { detached: true, stdio: ["pipe", "ignore", "ignore"] },
    );
    const exited = new Promise<number | null>((resolve) => wrapper.once("exit", (code) => resolve(code)));
    await waitFor(() => false, { timeoutMs: 0 }).catch(() => undefined);
    let exporterPid = 0;
    const deadline = performance.now() + 5_000;
    while (exporterPid === 0 && performance.now() < deadline) {
      exporterPid = (await starts())[0]?.pid ?? 0;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(alive(exporterPid)).toBe(true);
    // The kernel closes this end when its owner dies, whatever the signal.
    wrapper.stdin.end();
    // The fake exits 0 on SIGTERM; the wrapper with it.
    expect(await exited).toBe(0);
    expect(alive(exporterPid)).toBe(false);
  });
});
