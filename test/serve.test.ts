import { execFile } from "node:child_process";
import { chmod, mkdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker, testEngine } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { pollUntil } from "./support/service-runner.js";
import { bundleNodeFlags, SHIM_BUNDLE, ShimProcess, tempHome } from "./support/shim-process.js";

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

/**
 * A host whose volume tools are scripts on PATH (lsblk, blkid, mkfs.ext4, mount, mountpoint,
 * umount) over one GCP-style disk: blank until mkfs ran, and mkfs blocks while `block` exists
 * (a slow mkfs of a large disk; it records its pid so the test knows it runs).
 */
async function fakeVolumeHost() {
  const root = await tempHome("taskshim-fakevol-");
  const bin = join(root, "bin");
  const byId = join(root, "by-id");
  const mountRoot = join(root, "volumes");
  await Promise.all([mkdir(bin), mkdir(byId), mkdir(join(mountRoot, "data"), { recursive: true })]);
  await symlink("/dev/fake-pd", join(byId, "google-pd-data"));
  const state = (name: string): string => join(root, name);
  const tools: Record<string, string> = {
    lsblk: "echo 1073741824",
    blkid: `[ -e ${state("formatted")} ] && { echo ext4; exit 0; }; exit 2`,
    "mkfs.ext4": `echo $$ > ${state("mkfs.pid")}; while [ -e ${state("block")} ]; do sleep 0.1; done; touch ${state("formatted")}`,
    mount: `touch ${state("mounted")}`,
    mountpoint: `[ -e ${state("mounted")} ]`,
    umount: `rm -f ${state("mounted")}`,
  };
  for (const [name, body] of Object.entries(tools)) {
    await writeFile(join(bin, name), `#!/bin/sh\n${body}\n`);
    await chmod(join(bin, name), 0o755);
  }
  return {
    mountRoot,
    block: state("block"),
    formatted: state("formatted"),
    mkfsPid: state("mkfs.pid"),
    env: { PATH: `${bin}:${process.env.PATH ?? ""}`, TASKSHIM_DISK_BY_ID_DIR: byId },
    volume: { backend: "gcp", name: "data", volume_id: "vol-fake", init_fs: true, device_name: "pd-data" },
    /** Whether a mkfs is running now. */
    async mkfsRunning(): Promise<boolean> {
      const pid = Number(await readFile(state("mkfs.pid"), "utf8").catch(() => "0"));
      if (pid <= 0) return false;
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    },
  };
}

/** `taskshim <args>` (a client command) on the bundle; its stdout. */
async function runStatus(args: string[]): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [...bundleNodeFlags(), SHIM_BUNDLE, ...args],
    {
      timeout: 15_000,
    },
  );
  return stdout;
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

    // The engine refuses a 1 KiB memory limit: a user's mistake, not the shim's. Docker refuses
    // the create; Podman creates the container and runc refuses the start, which the shim (as
    // dstack-shim) reports as a start error, container_exited_with_error.
    const refusal =
      testEngine() === "podman"
        ? { reason: "container_exited_with_error", phrase: /unable to set memory limit to 1024/ }
        : { reason: "creating_container_error", phrase: /Minimum memory limit[^:]*/ };
    const cfg = { ...task(["true"]), memory: 1024 };
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_reason).toBe(refusal.reason);
    const failure = lines().find((l) => l.msg === "task failed to start" && l.taskId === cfg.id);
    expect(failure).toMatchObject({ level: 40 });
    expect(JSON.stringify(failure)).not.toContain("stack");
    const text = String(failure?.error);
    const phrase = refusal.phrase.exec(text)?.[0] ?? "";
    expect(phrase).not.toBe("");
    expect(text.split(phrase)).toHaveLength(2);
    await shim.remove(cfg.id);
  });

  it("names the engine it drives: healthcheck, /metrics, taskshim status and the serving line", async () => {
    // What the engine says of itself (GET /version), asked here, not through the shim.
    const answer = (await testDocker().version()) as unknown as {
      Version?: string;
      Components?: { Name?: string; Version?: string }[];
    };
    const kind = testEngine();
    const component = answer.Components?.find(
      (c) => c.Name === (kind === "podman" ? "Podman Engine" : "Engine"),
    );
    const version = component?.Version ?? answer.Version ?? "";
    expect(version).not.toBe("");
    const shim = await start();
    try {
      const health = await shim.request<{ engine: Record<string, unknown> }>("GET", "/api/healthcheck");
      expect(health.json.engine).toMatchObject({ status: "up", kind, version });

      const metrics = await fetch(`${shim.url}/metrics`).then((r) => r.text());
      expect(metrics.split("\n").filter((l) => l.startsWith("taskshim_engine_info"))).toEqual([
        `taskshim_engine_info{engine="${kind}",version="${version}"} 1`,
      ]);

      const status = await runStatus(["status", "--shim", shim.url]);
      expect(status.split("\n")).toContain(
        `engine:       ${kind} ${version}, up since ${String(health.json.engine.since)}`,
      );
      const json = JSON.parse(await runStatus(["status", "--json", "--shim", shim.url])) as {
        engine: Record<string, unknown>;
      };
      expect(json.engine).toMatchObject({ kind, version });

      const serving = shim.logs
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l.msg === "taskshim serving");
      expect(serving).toMatchObject({ engineKind: kind, engineVersion: version });
    } finally {
      await shim.stop();
    }
  });

  it("service mode: host_info.json measures the engine's own storage root, once per start, only when absent", async () => {
    // Docker's DockerRootDir, Podman's graph root (its compatible /info names it there).
    const rootDir = ((await testDocker().info()) as { DockerRootDir: string }).DockerRootDir;
    const shim = await start({ args: ["--service"] });
    const file = join(shim.home, "host_info.json");
    try {
      // Written once the API answers: dstack's server reads it every 3 s.
      const info = await pollUntil(
        async () => JSON.parse(await readFile(file, "utf8")) as { disk_size: number },
        10_000,
      );
      const { stdout } = await promisify(execFile)("stat", ["-f", "-c", "%a %S", rootDir]);
      const [bavail = 0, bsize = 0] = stdout.trim().split(" ").map(Number);
      expect(info.disk_size).toBeGreaterThan(0);
      expect(Math.abs(info.disk_size - bavail * bsize)).toBeLessThan(256 * 2 ** 20);
    } finally {
      await shim.stop();
    }
    // A file already there (dstack's server removes it before a deploy) is left as it is.
    await writeFile(file, "kept");
    const again = await start({ home: shim.home, args: ["--service"] });
    await again.stop();
    expect(await readFile(file, "utf8")).toBe("kept");
    expect(again.logs).toContain("host_info.json exists; left as it is");
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
    const health = (await shim.request("GET", "/api/healthcheck")).json as { lifecycle?: { phase: string } };
    expect(health.lifecycle?.phase).toBe("serving");
    const answer = await shim.request("POST", "/api/shutdown", { force: false });
    expect(answer.status).toBe(200);
    expect(await shim.waitExit()).toBe(0);
    // Through its whole shutdown (the home released, shim.log closed), not out of work to do.
    expect(shim.logs).toContain('"msg":"shutdown complete"');
    // The process's lifecycle, each transition logged once and in order.
    const phases = [...shim.logs.matchAll(/"phase":"(\w+)","from":"(\w+)".*"msg":"shim phase"/g)].map(
      (m) => `${m[2]}→${m[1]}`,
    );
    expect(phases).toEqual([
      "starting→restoring",
      "restoring→serving",
      "serving→draining",
      "draining→stopped",
    ]);
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

  it("U9 U10 POST /api/shutdown during a slow mkfs exits within the shutdown bound, and the task resumes after the restart (SIGTERM too)", async () => {
    const host = await fakeVolumeHost();
    const options = { args: ["--volume-mount-root", host.mountRoot], env: host.env };
    for (const how of ["POST /api/shutdown", "SIGTERM"] as const) {
      await writeFile(host.block, "");
      const shim = await start(options);
      const cfg = { ...task(["sleep", "300"]), volumes: [host.volume] };
      await shim.submit(cfg);
      // mkfs is reached (a blank disk, probed three times) and blocks: a 10-minute bound of its own.
      const deadline = Date.now() + 20_000;
      while (!(await host.mkfsRunning())) {
        if (Date.now() > deadline) throw new Error(`mkfs never ran:\n${shim.logs}`);
        await sleep(50);
      }
      const began = performance.now();
      if (how === "SIGTERM") shim.child.kill("SIGTERM");
      else expect((await shim.request("POST", "/api/shutdown", { force: false })).status).toBe(200);
      expect(await shim.waitExit(30_000)).toBe(0);
      const tookMs = performance.now() - began;
      // The grace (5 s), the interruption, then the exit: never past the bound (20 s).
      expect(tookMs).toBeGreaterThan(4_000);
      expect(tookMs).toBeLessThan(20_000);
      const lines = shim.logs.split("\n");
      expect(lines.filter((l) => l.includes('"boundMs":20000'))).toHaveLength(1);
      expect(lines.filter((l) => l.includes('"msg":"shutdown complete"'))).toEqual([
        expect.stringContaining('"outcome":"interrupted"'),
      ]);

      // The start was cut by the shim's own stop: the task waits in `preparing`, never executor_error.
      await rm(host.block);
      const again = await start({ ...options, home: shim.home });
      const resumed = await again.waitTask(
        cfg.id,
        (t) => t.status === "running" || t.status === "terminated",
      );
      expect(resumed).toMatchObject({ status: "running", termination_reason: "" });
      console.log(`${how} during mkfs: exited after ${Math.round(tookMs)} ms; the task resumed to running`);
      await again.terminate(cfg.id);
      await again.remove(cfg.id);
      await again.stop();
      await rm(host.formatted, { force: true });
      await rm(host.mkfsPid, { force: true });
    }
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
    // Detached: Podman refuses an exec start that attaches no stream ("must provide at least one
    // stream to attach to"); the container's exit is what the test waits for.
    await exec.start({ Detach: true });
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
