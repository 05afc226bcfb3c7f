import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { findDockerd, startDockerd, stopDockerd, waitEngine, withLiveRestore } from "./support/dockerd.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess } from "./support/shim-process.js";

/*
 * Matrix rows D1–D4 against the real engine: the engine hung (SIGSTOP), unreachable (stopped),
 * and restarted with and without live-restore. These stop or pause the machine's dockerd, so
 * they run alone (the docker project runs files one at a time) and always put it back.
 */

let images: TestImages;
let shim: ShimProcess;
let originalArgv: string[] = [];
let seq = 0;

function task(command: string[]) {
  seq += 1;
  return {
    id: `fault-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-fault-${seq}`,
    image_name: images.busybox,
    command,
  };
}

async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const started = performance.now();
  const value = await fn();
  return { ms: performance.now() - started, value };
}

beforeAll(async () => {
  images = await ensureTestImages();
  originalArgv = findDockerd().argv;
  shim = await ShimProcess.start();
});

afterAll(async () => {
  await shim?.stop();
  // Whatever happened, leave the engine as it was: running, with its original flags.
  try {
    const { pid, argv } = findDockerd();
    process.kill(pid, "SIGCONT");
    if (argv.join(" ") !== originalArgv.join(" ")) {
      await stopDockerd();
      await startDockerd(originalArgv);
    }
  } catch {
    await startDockerd(originalArgv);
  }
  await waitEngine();
});

describe("a shim that stays up when Docker does not", () => {
  it("D4 engine hung (SIGSTOP): reads answer from memory in well under 100 ms, no transition, converges after SIGCONT", async () => {
    const longRunner = task(["sleep", "300"]);
    const quickExit = task(["sh", "-c", "sleep 2; echo done-while-hung; exit 5"]);
    await shim.submit(longRunner);
    await shim.submit(quickExit);
    await shim.waitTask(longRunner.id, (t) => t.status === "running");
    await shim.waitTask(quickExit.id, (t) => t.status === "running");

    const { pid } = findDockerd();
    process.kill(pid, "SIGSTOP");
    const latencies: number[] = [];
    try {
      const until = Date.now() + 5_000;
      while (Date.now() < until) {
        for (const path of [
          "/api/tasks",
          `/api/tasks/${longRunner.id}`,
          `/api/tasks/${quickExit.id}`,
          "/api/healthcheck",
        ]) {
          const { ms, value } = await timed(() => shim.request("GET", path));
          expect(value.status).toBe(200);
          latencies.push(ms);
        }
        // The quick task's container has exited by now, but nothing may be inferred from a timeout.
        expect((await shim.task(quickExit.id)).status).toBe("running");
        await sleep(100);
      }
    } finally {
      process.kill(pid, "SIGCONT");
    }
    latencies.sort((a, b) => a - b);
    const max = latencies.at(-1) ?? 0;
    console.log(
      `D4: ${latencies.length} reads while dockerd was stopped; p50 ${latencies[latencies.length >> 1]?.toFixed(1)} ms, max ${max.toFixed(1)} ms`,
    );
    expect(max).toBeLessThan(100);

    const done = await shim.waitTerminated(quickExit.id, 30_000);
    expect(done.termination_reason).toBe("container_exited_with_error");
    expect(done.termination_message).toContain("done-while-hung");
    expect((await shim.task(longRunner.id)).status).toBe("running");
    await shim.terminate(longRunner.id);
  });

  it("D1+D3 engine unreachable (stopped with live-restore): no task terminated, health down, in line one tick after it returns", async () => {
    // Restart the engine with live-restore so stopping it leaves containers running.
    await stopDockerd();
    await startDockerd(withLiveRestore(originalArgv, true));
    const longRunner = task(["sleep", "300"]);
    const exitsWhileDown = task(["sh", "-c", "sleep 3; echo exited-while-down; exit 4"]);
    await shim.waitReady();
    await shim.submit(longRunner);
    await shim.submit(exitsWhileDown);
    const running = await shim.waitTask(longRunner.id, (t) => t.status === "running");
    await shim.waitTask(exitsWhileDown.id, (t) => t.status === "running");
    const startedAt = (await testDocker().getContainer(running.container_id).inspect()).State.StartedAt;

    const argv = await stopDockerd();
    try {
      await sleep(5_000);
      const health = await shim.request<{ engine: { status: string } }>("GET", "/api/healthcheck");
      expect(health.status).toBe(200);
      expect(health.json.engine.status).toBe("down");
      const list = await shim.request<{ tasks: { id: string; status: string }[] }>("GET", "/api/tasks");
      const statuses = new Map(list.json.tasks.map((t) => [t.id, t.status]));
      expect(statuses.get(longRunner.id)).toBe("running");
      expect(statuses.get(exitsWhileDown.id)).toBe("running");
    } finally {
      await startDockerd(argv);
    }
    const done = await shim.waitTerminated(exitsWhileDown.id, 15_000);
    expect(done.termination_reason).toBe("container_exited_with_error");
    expect((await testDocker().getContainer(done.container_id).inspect()).State.ExitCode).toBe(4);
    // Output written while dockerd is down may be lost by Docker itself (live-restore's FIFO),
    // but the exit fell inside the outage the shim saw, and the message says so.
    expect(done.termination_message).toContain("the docker engine was down or restarting");
    const still = await shim.task(longRunner.id);
    expect(still.status).toBe("running");
    const info = await testDocker().getContainer(running.container_id).inspect();
    expect(info.State.StartedAt).toBe(startedAt);
    expect(
      (await shim.request<{ engine: { status: string } }>("GET", "/api/healthcheck")).json.engine.status,
    ).toBe("up");
    await shim.terminate(longRunner.id);
  });

  it("D2 engine restarted without live-restore: the task the engine stopped ends terminated with its real exit code", async () => {
    await stopDockerd();
    await startDockerd(withLiveRestore(originalArgv, false));
    await shim.waitReady();
    const victim = task(["sleep", "300"]);
    await shim.submit(victim);
    await shim.waitTask(victim.id, (t) => t.status === "running");
    const argv = await stopDockerd();
    await startDockerd(argv);
    const done = await shim.waitTerminated(victim.id, 30_000);
    expect(done.termination_reason).toBe("container_exited_with_error");
    const exitCode = (await testDocker().getContainer(done.container_id).inspect()).State.ExitCode;
    expect([137, 143]).toContain(exitCode);
    // The engine stops containers while it still answers, so the shim may see this exit before
    // the outage; when the exit falls inside an outage it saw, the message blames the engine.
    if (done.termination_message !== "") {
      expect(done.termination_message).toMatch(/the docker engine was down or restarting/);
    }
  });
});
