import { existsSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess } from "./support/shim-process.js";

let shim: ShimProcess;
let images: TestImages;
let seq = 0;

/** A unique task id and a `tst-` name (the teardown removes `tst-` containers). */
function ids(label: string): { id: string; name: string } {
  seq += 1;
  const id = `${label}-${process.pid}-${seq}-${Date.now().toString(36)}`;
  return { id, name: `tst-${label}-${seq}` };
}

function commandTask(label: string, command: string[], extra: Record<string, unknown> = {}) {
  return { ...ids(label), image_name: images.busybox, command, ...extra };
}

async function inspect(id: string) {
  return testDocker().getContainer(id).inspect();
}

beforeAll(async () => {
  images = await ensureTestImages();
  shim = await ShimProcess.start();
});

afterAll(async () => {
  await shim?.stop();
});

describe("task lifecycle on a real engine", () => {
  it("runs a task to done_by_runner and keeps the container until remove", async () => {
    const cfg = commandTask("ok", ["sh", "-c", "echo fine; exit 0"]);
    const submitted = await shim.submit(cfg);
    expect(submitted.id).toBe(cfg.id);
    expect(submitted.container_name).toMatch(new RegExp(`^${cfg.name}-[0-9a-f]{8}$`));
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_reason).toBe("done_by_runner");
    expect(done.termination_message).toBe("");
    expect(done.ports).toEqual([]);
    const info = await inspect(done.container_id);
    expect(info.State.ExitCode).toBe(0);
    expect(info.HostConfig.RestartPolicy?.Name).toBe("no");
    expect(info.HostConfig.AutoRemove).toBe(false);
    expect(info.Config.Labels).toMatchObject({
      "ai.dstack.shim.is-task": "true",
      "ai.dstack.shim.task-id": cfg.id,
    });
  });

  it("ends a failing task as container_exited_with_error with its last 5 log lines", async () => {
    const cfg = commandTask("fail", ["sh", "-c", "for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 3"]);
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_reason).toBe("container_exited_with_error");
    expect(done.termination_message.split("\n")).toEqual(["line3", "line4", "line5", "line6", "line7"]);
    expect((await inspect(done.container_id)).State.ExitCode).toBe(3);
  });

  it("includes stderr in the last log lines of a failed task", async () => {
    // stdout and stderr are separate pipes, so only lines of one stream have a defined order.
    const cfg = commandTask("stderr", ["sh", "-c", "echo first >&2; echo 'Traceback: boom' >&2; exit 1"]);
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_message).toBe("first\nTraceback: boom");
  });

  it("terminate stops a running task and keeps the first reason and message", async () => {
    const cfg = commandTask("term", ["sleep", "300"]);
    await shim.submit(cfg);
    await shim.waitTask(cfg.id, (t) => t.status === "running");
    const first = await shim.terminate(cfg.id, "terminated_by_user", "stopped by alice", 1);
    expect(first.status).toBe(200);
    expect(first.json.status).toBe("terminated");
    expect(first.json.termination_reason).toBe("terminated_by_user");
    const second = await shim.terminate(cfg.id, "terminated_by_server", "cleanup", 0);
    expect(second.status).toBe(200);
    expect(second.json.termination_reason).toBe("terminated_by_user");
    expect(second.json.termination_message).toBe("stopped by alice");
    const info = await inspect(first.json.container_id);
    expect(info.State.Running).toBe(false);
    // The reconciler must not overwrite the requested reason with the exit code.
    await new Promise((r) => setTimeout(r, 1500));
    expect((await shim.task(cfg.id)).termination_reason).toBe("terminated_by_user");
  });

  it("remove deletes the container and the task dir, and the task is gone", async () => {
    const cfg = commandTask("rm", ["true"]);
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    const taskDir = join(shim.home, "runners", done.container_name);
    expect(existsSync(join(taskDir, "task.json"))).toBe(true);
    const removed = await shim.remove(cfg.id);
    expect(removed.status).toBe(200);
    expect(removed.text).toBe("\n");
    await expect(inspect(done.container_id)).rejects.toMatchObject({ statusCode: 404 });
    expect(existsSync(taskDir)).toBe(false);
    expect((await shim.request("GET", `/api/tasks/${cfg.id}`)).status).toBe(404);
  });

  it("refuses to remove a running task with 409", async () => {
    const cfg = commandTask("rm409", ["sleep", "300"]);
    await shim.submit(cfg);
    await shim.waitTask(cfg.id, (t) => t.status === "running");
    const answer = await shim.remove(cfg.id);
    expect(answer.status).toBe(409);
    expect(answer.text).toBe(`request error: cannot remove task ${cfg.id} with running status\n`);
    await shim.terminate(cfg.id);
    expect((await shim.remove(cfg.id)).status).toBe(200);
  });

  it("reports ephemeral 127.0.0.1 ports in bridge mode", async () => {
    const cfg = commandTask("bridge", ["sleep", "300"], { network_mode: "bridge" });
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    const ports = running.ports ?? [];
    expect(ports.map((p) => p.container).sort()).toEqual([10022, 10999]);
    const info = await inspect(running.container_id);
    for (const p of ports) {
      expect(p.host).toBeGreaterThan(0);
      const binding = info.NetworkSettings.Ports[`${p.container}/tcp`]?.[0];
      expect(binding?.HostIp).toBe("127.0.0.1");
      expect(Number(binding?.HostPort)).toBe(p.host);
    }
    await shim.terminate(cfg.id);
    await shim.remove(cfg.id);
  });

  it("mounts /dev/shm exec with the requested shm_size", async () => {
    const cfg = commandTask("shm", ["sh", "-c", "mount | grep ' /dev/shm '; exit 1"], {
      shm_size: 1024 * 1024,
    });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    expect(done.termination_message).toContain("size=1024k");
    expect(done.termination_message).not.toContain("noexec");
  });

  // Privileged containers cannot start in this sandbox (runc may not apply all caps), so the
  // privileged flag is checked on the container spec in the unit tests instead.
  it("applies cpu, memory, env and instance mounts to the container", async () => {
    const hostDir = join(shim.home, "instance-data", "fresh");
    const cfg = commandTask("res", ["sh", "-c", "echo $GREETING > /data/out.txt; exit 1"], {
      cpu: 0.5,
      memory: 64 * 1024 * 1024,
      env: { GREETING: "hello from env" },
      instance_mounts: [{ instance_path: hostDir, path: "/data", optional: false }],
    });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    const info = await inspect(done.container_id);
    expect(info.HostConfig.NanoCpus).toBe(500_000_000);
    expect(info.HostConfig.Memory).toBe(64 * 1024 * 1024);
    expect(info.HostConfig.Privileged).toBe(false);
    expect(info.HostConfig.NetworkMode).toBe("host");
    expect(info.Config.User).toBe("root");
    // A missing instance path is created world-writable, and the container wrote through it.
    expect(await readFile(join(hostDir, "out.txt"), "utf8")).toBe("hello from env\n");
    expect((await stat(hostDir)).mode & 0o777).toBe(0o777);
  });

  it("sees a container's exit within half a second", async () => {
    // The median of three exits, so one scheduling hiccup on a shared machine does not decide.
    const delays: number[] = [];
    for (let trial = 0; trial < 3; trial++) {
      const cfg = commandTask(`fast${trial}`, ["sh", "-c", "sleep 1; exit 7"]);
      await shim.submit(cfg);
      const running = await shim.waitTask(cfg.id, (t) => t.status === "running", 30_000, 5);
      const done = await shim.waitTask(cfg.id, (t) => t.status === "terminated", 30_000, 5);
      const seenAt = Date.now();
      const finishedAt = Date.parse((await inspect(running.container_id)).State.FinishedAt);
      expect(done.termination_reason).toBe("container_exited_with_error");
      delays.push(seenAt - finishedAt);
    }
    delays.sort((a, b) => a - b);
    console.log(`exit seen by the API after ${delays.join(", ")} ms`);
    expect(delays[1]).toBeLessThan(500);
  });

  it("survives concurrent terminate and remove on one task without crash or leak", async () => {
    for (let round = 0; round < 3; round++) {
      const cfg = commandTask(`race${round}`, ["sleep", "300"]);
      await shim.submit(cfg);
      const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
      const answers = await Promise.all([
        shim.terminate(cfg.id),
        shim.remove(cfg.id),
        shim.terminate(cfg.id, "terminated_by_server"),
        shim.remove(cfg.id),
      ]);
      for (const a of answers) expect([200, 404, 409]).toContain(a.status);
      // Whatever the interleaving, a final remove leaves nothing behind.
      const final = await shim.remove(cfg.id);
      expect([200, 404]).toContain(final.status);
      expect((await shim.request("GET", `/api/tasks/${cfg.id}`)).status).toBe(404);
      await expect(inspect(running.container_id)).rejects.toMatchObject({ statusCode: 404 });
      expect(existsSync(join(shim.home, "runners", running.container_name))).toBe(false);
    }
    expect((await shim.request("GET", "/api/healthcheck")).status).toBe(200);
  });

  it("treats a repeated submit as idempotent and a changed one as a conflict", async () => {
    const cfg = commandTask("idem", ["sleep", "300"]);
    const first = await shim.request("POST", "/api/tasks", cfg);
    const again = await shim.request<{ id: string }>("POST", "/api/tasks", cfg);
    expect(first.status).toBe(200);
    expect(again.status).toBe(200);
    expect(again.json.id).toBe(cfg.id);
    const changed = await shim.request("POST", "/api/tasks", { ...cfg, command: ["sleep", "1"] });
    expect(changed.status).toBe(409);
    expect(changed.text).toMatch(/^request error: /);
    await shim.waitTask(cfg.id, (t) => t.status === "running");
    const containers = await testDocker().listContainers({
      all: true,
      filters: { label: [`ai.dstack.shim.task-id=${cfg.id}`] },
    });
    expect(containers).toHaveLength(1);
    await shim.terminate(cfg.id);
    await shim.remove(cfg.id);
  });

  it("writes task.json in a private task dir whose runner/ subdir alone is mounted", async () => {
    const cfg = commandTask("dir", ["sh", "-c", "ls -a /tmp/runner; exit 1"], {
      registry_username: "someone",
      registry_password: "hunter2-secret",
    });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id);
    const taskDir = join(shim.home, "runners", done.container_name);
    // An exit's terminal status is shown before it is durable (docs/architecture.md): the write
    // follows within milliseconds, so the file is read once it holds one.
    const state = await vi.waitFor(async () => {
      const read = JSON.parse(await readFile(join(taskDir, "task.json"), "utf8")) as Record<string, unknown>;
      expect(read.termination_reason).not.toBe("");
      return read;
    });
    expect(state).toMatchObject({
      version: 1,
      id: cfg.id,
      termination_reason: "container_exited_with_error",
    });
    expect(JSON.stringify(state)).not.toContain("hunter2-secret");
    expect(shim.logs).not.toContain("hunter2-secret");
    expect(done.termination_message).not.toContain("task.json");
    const info = await inspect(done.container_id);
    const mount = info.Mounts.find((m) => m.Destination === "/tmp/runner");
    expect(mount?.Source).toBe(join(taskDir, "runner"));
  });
});
