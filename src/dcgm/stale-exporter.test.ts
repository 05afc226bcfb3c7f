import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  EXPORTER_PID_FILE,
  isExporterOnPort,
  killStaleExporters,
  readExporterRecord,
  writeExporterRecord,
  type ProcEntry,
  type ProcessTable,
} from "./stale-exporter.js";

/** A process table in memory: signals are recorded; `stubborn` pids survive SIGTERM. */
function table(entries: ProcEntry[], stubborn: readonly number[] = []) {
  const dead = new Set<number>();
  const signals: string[] = [];
  const t: ProcessTable = {
    list: () => Promise.resolve(entries.filter((e) => !dead.has(e.pid))),
    kill: (pid, signal) => {
      signals.push(`${signal} ${pid}`);
      if (signal === "SIGKILL" || !stubborn.includes(pid)) dead.add(pid);
      return true;
    },
    alive: (pid) => Promise.resolve(!dead.has(pid)),
  };
  return { table: t, signals };
}

const proc = (pid: number, pgid: number, argv: string[], zombie = false): ProcEntry => ({
  pid,
  pgid,
  argv,
  zombie,
});

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "taskshim-stale-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

describe("isExporterOnPort", () => {
  it("matches dcgm-exporter started on localhost:<port>, directly or as a script", () => {
    const args = ["-f", "/tmp/c.csv", "-a", "localhost:10997", "-c", "5000"];
    expect(isExporterOnPort(["/usr/bin/dcgm-exporter", ...args], "dcgm-exporter", 10997)).toBe(true);
    expect(isExporterOnPort(["node", "/t/dcgm-exporter", ...args], "dcgm-exporter", 10997)).toBe(true);
    expect(isExporterOnPort(["/usr/bin/dcgm-exporter", ...args], "dcgm-exporter", 9400)).toBe(false);
    // An operator's exporter on its own address is not ours.
    expect(isExporterOnPort(["/usr/bin/dcgm-exporter", "-a", ":10997"], "dcgm-exporter", 10997)).toBe(false);
    expect(isExporterOnPort(["/bin/sleep", "-a", "localhost:10997"], "dcgm-exporter", 10997)).toBe(false);
  });
});

describe("killStaleExporters", () => {
  const args = (port: number) => ["-f", "/tmp/c.csv", "-a", `localhost:${port}`, "-c", "5000"];

  it("A19 stops the recorded wrapper's group and exporters on the port; leaves everything else", async () => {
    await writeFile(
      join(home, EXPORTER_PID_FILE),
      JSON.stringify({ pgid: 500, executable: "dcgm-exporter", port: 10997 }),
    );
    const { table: t, signals } = table([
      proc(500, 500, ["/bin/sh", "-c", "…", "dcgm-exporter-wrapper", "dcgm-exporter", ...args(10997)]),
      proc(501, 500, ["dcgm-exporter", ...args(10997)]),
      // dstack-shim's exporter, left by a handover: no record, but on our port with its arguments.
      proc(700, 700, ["/usr/bin/dcgm-exporter", ...args(10997)]),
      // An operator's exporter elsewhere, an unrelated process of a reused group id, a zombie.
      proc(800, 800, ["/usr/bin/dcgm-exporter", "-a", ":9400"]),
      proc(900, 500, ["/usr/bin/python3", "app.py"]),
      proc(901, 901, ["dcgm-exporter", ...args(10997)], true),
    ]);
    const cleanup = await killStaleExporters({
      home,
      executable: "dcgm-exporter",
      port: 10997,
      graceMs: 200,
      table: t,
    });
    expect(cleanup.killed.map((p) => p.pid)).toEqual([500, 501, 700]);
    expect(cleanup.forced).toBe(false);
    expect(signals).toEqual(["SIGTERM 500", "SIGTERM 501", "SIGTERM 700"]);
    await expect(readFile(join(home, EXPORTER_PID_FILE))).rejects.toThrow();
  });

  it("SIGKILLs what is still there after the grace", async () => {
    const { table: t, signals } = table([proc(700, 700, ["dcgm-exporter", ...args(10997)])], [700]);
    const startedAt = performance.now();
    const cleanup = await killStaleExporters({
      home,
      executable: "dcgm-exporter",
      port: 10997,
      graceMs: 150,
      table: t,
    });
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(140);
    expect(cleanup.forced).toBe(true);
    expect(signals).toEqual(["SIGTERM 700", "SIGKILL 700"]);
  });

  it("does nothing on a clean host, and reads a damaged pid file as none", async () => {
    await writeFile(join(home, EXPORTER_PID_FILE), "{not json");
    const { table: t, signals } = table([proc(1, 1, ["/sbin/init"])]);
    const cleanup = await killStaleExporters({
      home,
      executable: "dcgm-exporter",
      port: 10997,
      graceMs: 100,
      table: t,
    });
    expect(cleanup.killed).toEqual([]);
    expect(signals).toEqual([]);
  });
});

describe("the pid file", () => {
  it("is read bounded and typed: a FIFO, a symlink to /dev/zero or a huge file is no record, at once", async () => {
    const path = join(home, EXPORTER_PID_FILE);
    execFileSync("mkfifo", [path]);
    expect(await readExporterRecord(home)).toBeUndefined();
    await rm(path);
    await symlink("/dev/zero", path);
    expect(await readExporterRecord(home)).toBeUndefined();
    await rm(path);
    await writeFile(path, " ".repeat(1024 * 1024));
    expect(await readExporterRecord(home)).toBeUndefined();
  });

  it("is written over a planted symlink, never through it", async () => {
    const elsewhere = join(home, "elsewhere");
    await writeFile(elsewhere, "kept");
    await symlink(elsewhere, join(home, EXPORTER_PID_FILE));
    const record = { pgid: 4242, executable: "/usr/bin/dcgm-exporter", port: 10997 };
    await writeExporterRecord(home, record);
    expect(await readFile(elsewhere, "utf8")).toBe("kept");
    expect(await readExporterRecord(home)).toEqual(record);
  });
});
