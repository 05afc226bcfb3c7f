import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { EXPORTER_GPUS, exporterText, fakeExporterScript } from "../src/dcgm/test-support.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { freePort, ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * DCGM Exporter under the built shim, on an NVIDIA host made of a GPU fixture: a fake
 * `dcgm-exporter` (a Node program serving exporter text, src/dcgm/test-support.ts) is first on
 * the shim's PATH. It is started with dstack-shim's arguments, started again when killed, stopped
 * with the shim, and never left holding the port: not when the shim is killed with SIGKILL, nor
 * when its wrapper is killed with it (the next start cleans up).
 */

let images: TestImages;
let dir: string;
let fixture: string;
let startsLog: string;
let bin: string;
const shims: ShimProcess[] = [];

/** Running, not a zombie (an init that does not reap keeps those). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** The pids of a process group's members, from /proc. */
function groupMembers(pgid: number): number[] {
  return readdirSync("/proc")
    .filter((name) => /^\d+$/.test(name))
    .filter((name) => {
      try {
        const stat = readFileSync(`/proc/${name}/stat`, "utf8");
        return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[2]) === pgid;
      } catch {
        return false;
      }
    })
    .map(Number);
}

async function starts(): Promise<{ pid: number; args: string[] }[]> {
  const text = await readFile(startsLog, "utf8").catch(() => "");
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { pid: number; args: string[] });
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** The next exporter started after the `seen` starts recorded so far. */
function nextStart(seen: number): Promise<{ pid: number; args: string[] }> {
  return until("the next exporter's start", async () => {
    const all = await starts();
    return all.length > seen ? all.at(-1) : undefined;
  });
}

/** Whether something answers exporter text at the port (any exporter, ours or a stale one). */
async function exporterAnswers(port: number): Promise<boolean> {
  try {
    const response = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(3_000) });
    return response.status === 200 && (await response.text()) === exporterText();
  } catch {
    return false;
  }
}

async function startShim(exporterPort: number, home?: string): Promise<ShimProcess> {
  const shim = await ShimProcess.start({
    ...(home ? { home } : {}),
    args: [
      "--gpu-fixture",
      fixture,
      "--dcgm-exporter-http-port",
      String(exporterPort),
      "--dcgm-exporter-interval",
      "1000",
    ],
    env: { PATH: `${bin}:${process.env.PATH ?? ""}`, FAKE_EXPORTER_LOG: startsLog },
  });
  shims.push(shim);
  return shim;
}

/** Waits until the shim serves the exporter's answer (the first task-metrics read that is not a 502). */
async function exporterServing(shim: ShimProcess, taskId: string): Promise<void> {
  await until(`the exporter behind ${shim.url}`, async () => {
    const answer = await shim.request("GET", `/metrics/tasks/${taskId}`);
    return answer.status === 200 ? true : undefined;
  });
}

beforeAll(async () => {
  images = await ensureTestImages();
  dir = await tempHome("taskshim-dcgm-");
  bin = join(dir, "bin");
  await mkdir(bin);
  await writeFile(join(bin, "dcgm-exporter"), fakeExporterScript(process.execPath));
  await chmod(join(bin, "dcgm-exporter"), 0o755);
  fixture = join(dir, "gpus.json");
  await writeFile(
    fixture,
    JSON.stringify({
      vendor: "nvidia",
      driver_version: "570.86.15",
      gpus: EXPORTER_GPUS.slice(0, 2).map((uuid) => ({
        name: "NVIDIA H100 80GB HBM3",
        vram_mib: 81_559,
        uuid,
      })),
    }),
  );
});

afterEach(async () => {
  for (const shim of shims.splice(0)) await shim.stop().catch(() => undefined);
  for (const s of await starts()) if (alive(s.pid)) process.kill(s.pid, "SIGKILL");
});

afterAll(async () => {
  for (const s of await starts()) if (alive(s.pid)) process.kill(s.pid, "SIGKILL");
});

let seq = 0;
function cpuTask() {
  seq += 1;
  return {
    id: `dcgm-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-dcgm-${seq}`,
    image_name: images.busybox,
    command: ["sleep", "300"],
  };
}

describe("DCGM Exporter under the shim (NVIDIA fixture, fake exporter)", () => {
  it("runs it with dstack-shim's arguments and serves a task's share of its answer", async () => {
    startsLog = join(dir, `starts-${seq}.jsonl`);
    const port = await freePort();
    const shim = await startShim(port);
    const task = cpuTask();
    await shim.submit(task);
    const running = await shim.waitTask(task.id, (t) => t.status === "running");
    expect(running.gpus_ids).toEqual([]);
    await exporterServing(shim, task.id);
    const [first] = await starts();
    expect(first?.args.slice(2)).toEqual(["-a", `localhost:${port}`, "-c", "1000"]);
    expect(first?.args[0]).toBe("-f");
    // A task without GPUs gets none of the exporter's samples; an unknown task is dstack's 404.
    const answer = await shim.request("GET", `/metrics/tasks/${task.id}`);
    expect([answer.status, answer.text, answer.contentType]).toEqual([
      200,
      "",
      "text/plain; version=0.0.4; charset=utf-8",
    ]);
    const unknown = await shim.request("GET", "/metrics/tasks/no-such-task");
    expect([unknown.status, unknown.text]).toEqual([404, "Task not found\n"]);
    expect((await shim.request("GET", "/api/instance/info")).json).toEqual({
      gpu_vendor: "nvidia",
      gpu_driver_version: "570.86.15",
    });
    // No dcgmi on this host: no health source.
    expect((await shim.request("GET", "/api/instance/health")).json).toEqual({ dcgm: null });
    await shim.terminate(task.id);
    await shim.waitTerminated(task.id);
  });

  it("starts it again when it dies, and stops it with the shim", async () => {
    startsLog = join(dir, `starts-${seq}-restart.jsonl`);
    const port = await freePort();
    const shim = await startShim(port);
    const task = cpuTask();
    await shim.submit(task);
    await exporterServing(shim, task.id);
    const first = (await starts()).at(-1);
    const seen = (await starts()).length;
    process.kill(first?.pid ?? 0, "SIGKILL");
    const second = await nextStart(seen);
    expect(second.pid).not.toBe(first?.pid);
    await exporterServing(shim, task.id);
    expect(shim.logs).toContain("DCGM Exporter exited; starting it again");
    await shim.terminate(task.id);
    await shim.waitTerminated(task.id);
    expect(await shim.stop()).toBe(0);
    expect(alive(second.pid)).toBe(false);
    expect(await exporterAnswers(port)).toBe(false);
    await expect(readFile(join(shim.home, "dcgm-exporter.pid"))).rejects.toThrow();
  });

  it("A18 leaves no exporter holding the port after a SIGKILL of the shim, and the next shim runs its own", async () => {
    startsLog = join(dir, `starts-${seq}-kill.jsonl`);
    const port = await freePort();
    const shim = await startShim(port);
    await until("the exporter", async () => ((await exporterAnswers(port)) ? true : undefined));
    const first = (await starts()).at(-1);
    await shim.kill();
    // The wrapper sees its pipe from the shim close and stops the exporter.
    await until(
      "the exporter to end",
      () => Promise.resolve(alive(first?.pid ?? 0) ? undefined : true),
      5_000,
    );
    expect(await exporterAnswers(port)).toBe(false);
    // Started again on the same home and port: its own exporter takes the port, nothing to clean.
    const seen = (await starts()).length;
    const next = await startShim(port, shim.home);
    const second = await nextStart(seen);
    await until("the new exporter", async () => ((await exporterAnswers(port)) ? true : undefined));
    expect(alive(second.pid)).toBe(true);
    expect(next.logs).not.toContain("left by an earlier shim");
  });

  it("A19 kills an exporter whose wrapper died with the shim at the next start, then runs its own", async () => {
    startsLog = join(dir, `starts-${seq}-stale.jsonl`);
    const port = await freePort();
    const shim = await startShim(port);
    await until("the exporter", async () => ((await exporterAnswers(port)) ? true : undefined));
    // The exporter serving now (the last start: a first attempt may have failed).
    const first = (await starts()).at(-1);
    const record = JSON.parse(await readFile(join(shim.home, "dcgm-exporter.pid"), "utf8")) as {
      pgid: number;
    };
    // The wrapper (its sh and its pipe watcher) and the shim die together, an OOM kill of all of
    // them: nothing watches the exporter now. The watcher first: a shim that sees its sh exit
    // closes the pipe, and a watcher still alive would stop the exporter (as it should).
    const members = groupMembers(record.pgid).filter((pid) => pid !== first?.pid);
    for (const pid of members.filter((pid) => pid !== record.pgid)) process.kill(pid, "SIGKILL");
    process.kill(record.pgid, "SIGKILL");
    await shim.kill();
    await sleep(300);
    expect(alive(first?.pid ?? 0)).toBe(true);
    expect(await exporterAnswers(port)).toBe(true);
    // The next shim on the same home stops it before starting its own on the same port.
    const seen = (await starts()).length;
    const next = await startShim(port, shim.home);
    const second = await nextStart(seen);
    expect(alive(first?.pid ?? 0)).toBe(false);
    expect(next.logs).toContain("stopped a DCGM Exporter left by an earlier shim");
    await until("the new exporter", async () => ((await exporterAnswers(port)) ? true : undefined));
    expect(alive(second.pid)).toBe(true);
  });
});
