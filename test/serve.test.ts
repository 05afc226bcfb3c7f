import { createServer, type Server } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess } from "./support/shim-process.js";

let images: TestImages;
let seq = 0;
const started: ShimProcess[] = [];

async function start(options: Parameters<typeof ShimProcess.start>[0] = {}): Promise<ShimProcess> {
  const shim = await ShimProcess.start(options);
  started.push(shim);
  return shim;
}

function task(command: string[]) {
  seq += 1;
  return {
    id: `serve-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-serve-${seq}`,
    image_name: images.busybox,
    command,
  };
}

async function startedAt(containerId: string): Promise<string> {
  return (await testDocker().getContainer(containerId).inspect()).State.StartedAt;
}

beforeAll(async () => {
  images = await ensureTestImages();
});

afterAll(async () => {
  for (const shim of started) await shim.stop().catch(() => undefined);
});

describe("taskshim serve", () => {
  it("exits 1 with one clear line when the engine is unreachable", async () => {
    const shim = await start({ env: { DOCKER_HOST: "unix:///nonexistent/docker.sock" }, waitReady: false });
    expect(await shim.waitExit()).toBe(1);
    const lines = shim.logs.trim().split("\n");
    expect(lines.at(-1)).toMatch(
      /^taskshim: docker engine unreachable \(unix:\/\/\/nonexistent\/docker\.sock\)/,
    );
  });

  it("exits 1 with one line within a second when the port is taken, before restoring anything", async () => {
    // Tasks that finish while the shim is down: a restore would finalize each with a log line.
    const first = await start();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await first.submit(task(["sh", "-c", "sleep 1; exit 3"]))).id);
    for (const id of ids) await first.waitTask(id, (t) => t.status === "running");
    await first.kill();
    await new Promise((resolve) => setTimeout(resolve, 2_000));

    const blocker: Server = createServer();
    await new Promise<void>((resolve) => blocker.listen(first.port, "127.0.0.1", resolve));
    try {
      const began = Date.now();
      const shim = await start({ home: first.home, port: first.port, waitReady: false });
      expect(await shim.waitExit()).toBe(1);
      const took = Date.now() - began;
      expect(shim.logs.trim().split("\n")).toEqual([
        `taskshim: port ${first.port} on 127.0.0.1 is already in use (choose another with --shim-http-port)`,
      ]);
      // Node's own start-up is part of this second (~0.2 s here).
      expect(took).toBeLessThan(1_000);
    } finally {
      blocker.close();
    }
    // The tasks were left for the next start: it finalizes them with their real exit code.
    const next = await start({ home: first.home });
    for (const id of ids) {
      const done = await next.waitTerminated(id);
      expect(done.termination_reason).toBe("container_exited_with_error");
    }
    for (const id of ids) await next.remove(id);
  });

  it("refuses a bad flag value with a configuration error (exit 78, so supervise stops)", async () => {
    const shim = await start({ args: ["--shim-log-level", "loud"], waitReady: false });
    expect(await shim.waitExit()).toBe(78);
    expect(shim.logs).toMatch(/taskshim: configuration error: invalid log level "loud"/);
  });

  it("refuses an unknown flag in one line, without the usage (exit 78)", async () => {
    const shim = await start({ args: ["--bogus"], waitReady: false });
    expect(await shim.waitExit()).toBe(78);
    expect(shim.logs.trim().split("\n")).toEqual([
      "taskshim: configuration error: unknown option '--bogus' (see taskshim serve --help)",
    ]);
  });

  it("logs ISO times, a serving line with address, home, engine and version, and an expected failure once without a stack", async () => {
    const shim = await start();
    const lines = () =>
      shim.logs
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
    const serving = lines().find((l) => l.msg === "taskshim serving");
    expect(serving).toMatchObject({
      address: shim.url,
      home: shim.home,
      engine: process.env.DOCKER_HOST ?? "unix:///var/run/docker.sock",
      version: expect.stringMatching(/^\d+\.\d+\.\d+/) as unknown,
    });
    expect(serving?.time).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);

    // The engine refuses a 1 KiB memory limit: a user's mistake, not the shim's.
    const cfg = { ...task(["true"]), memory: 1024 };
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_reason).toBe("creating_container_error");
    const failure = lines().find((l) => l.msg === "task failed to start" && l.taskId === cfg.id);
    expect(failure).toMatchObject({ level: 40 });
    expect(JSON.stringify(failure)).not.toContain("stack");
    const text = String(failure?.error);
    const phrase = /Minimum memory limit[^:]*/.exec(text)?.[0] ?? "";
    expect(phrase).not.toBe("");
    expect(text.split(phrase)).toHaveLength(2);
    await shim.remove(cfg.id);
  });

  it("U4 never runs two shims on one home", async () => {
    const first = await start();
    const second = await start({ home: first.home, waitReady: false });
    expect(await second.waitExit()).toBe(1);
    expect(second.logs).toContain(`another taskshim is already running with home ${first.home}`);
    expect((await first.request("GET", "/api/healthcheck")).status).toBe(200);
    await first.stop();
  });

  it("binds 127.0.0.1 by default", async () => {
    const shim = await start();
    expect(shim.logs).toContain(`"address":"http://127.0.0.1:${shim.port}"`);
    await shim.stop();
  });

  it("shuts down on POST /api/shutdown with exit 0, leaving containers running, and adopts them again", async () => {
    const shim = await start();
    const cfg = task(["sleep", "300"]);
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    const before = await startedAt(running.container_id);
    const answer = await shim.request("POST", "/api/shutdown", { force: false });
    expect(answer.status).toBe(200);
    expect(await shim.waitExit()).toBe(0);
    // Through its whole shutdown (the home released, shim.log closed), not out of work to do.
    expect(shim.logs).toContain('"msg":"shutdown complete"');
    expect((await testDocker().getContainer(running.container_id).inspect()).State.Running).toBe(true);

    const again = await start({ home: shim.home });
    const restored = await again.task(cfg.id);
    expect(restored.status).toBe("running");
    expect(restored.container_id).toBe(running.container_id);
    expect(await startedAt(running.container_id)).toBe(before);
    await again.terminate(cfg.id);
    await again.remove(cfg.id);
    await again.stop();
  });

  it("exits 0 on SIGTERM with containers untouched", async () => {
    const shim = await start();
    const cfg = task(["sleep", "300"]);
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    expect(await shim.stop()).toBe(0);
    expect((await testDocker().getContainer(running.container_id).inspect()).State.Running).toBe(true);
    await testDocker().getContainer(running.container_id).remove({ force: true });
  });

  it("finalizes an exit that happened while it was down, with the real code and logs, before serving", async () => {
    const shim = await start();
    const cfg = task([
      "sh",
      "-c",
      "echo started; while [ ! -e /tmp/runner/go ]; do sleep 0.1; done; echo bye; exit 3",
    ]);
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    await shim.kill();
    const container = testDocker().getContainer(running.container_id);
    const exec = await container.exec({ Cmd: ["touch", "/tmp/runner/go"] });
    await exec.start({});
    await container.wait();

    const again = await start({ home: shim.home });
    // The very first answer is already final.
    const first = await again.task(cfg.id);
    expect(first.status).toBe("terminated");
    expect(first.termination_reason).toBe("container_exited_with_error");
    expect(first.termination_message).toBe("started\nbye");
    await again.remove(cfg.id);
    await again.stop();
  });

  it("keeps a terminate answered with 200 across a kill, and a removed task stays gone", async () => {
    const shim = await start();
    const a = task(["sleep", "300"]);
    const b = task(["true"]);
    await shim.submit(a);
    await shim.submit(b);
    await shim.waitTask(a.id, (t) => t.status === "running");
    await shim.waitTerminated(b.id);
    expect((await shim.terminate(a.id, "max_duration_exceeded", "too long")).status).toBe(200);
    expect((await shim.remove(b.id)).status).toBe(200);
    await shim.kill();

    const again = await start({ home: shim.home });
    const terminated = await again.task(a.id);
    expect(terminated.termination_reason).toBe("max_duration_exceeded");
    expect(terminated.termination_message).toBe("too long");
    expect((await again.request("GET", `/api/tasks/${b.id}`)).status).toBe(404);
    await again.remove(a.id);
    await again.stop();
  });

  it("keeps a task whose container vanished while it was down, terminated with an unknown exit", async () => {
    const shim = await start();
    const cfg = task(["sleep", "300"]);
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    await shim.kill();
    await testDocker().getContainer(running.container_id).remove({ force: true });
    const again = await start({ home: shim.home });
    const gone = await again.task(cfg.id);
    expect(gone.status).toBe("terminated");
    expect(gone.termination_reason).toBe("executor_error");
    expect(gone.termination_message).toBe("container not found");
    await again.remove(cfg.id);
    await again.stop();
  });
});
