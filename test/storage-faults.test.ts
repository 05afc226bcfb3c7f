import { execFile } from "node:child_process";
import { closeSync, openSync, writeSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ChaosStats } from "./support/chaos-stats.js";
import { testDocker } from "./support/docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import { freePort, SHIM_BUNDLE, ShimProcess, type TaskInfo } from "./support/shim-process.js";

/*
 * Host storage faults (docs/fault-matrix.md rows S4 and S5) with real faults: the shim's home
 * on a size-limited tmpfs (ENOSPC), on an ext4 file system in a loop file made immutable
 * (`chattr +i`: EPERM) or remounted read-only (EROFS), and the failpoints' `error(EIO)` action at
 * the durable writes (EIO). Each scenario checks the rule — the shim stays up, an error answer
 * changed nothing, a 200 is durable — then gives the storage back and checks the catch-up:
 * task.json says what the API says (status, reason, the container's exit code), containers that
 * ran still run, nothing leaked. Every mount is undone in a `finally`. Runs as root.
 */

const exec = promisify(execFile);
/** STORAGE_FAULTS_SHIM_BUNDLE runs another bundle than dist/taskshim.cjs (an older build, say). */
const bundle = process.env.STORAGE_FAULTS_SHIM_BUNDLE;
const start = (options: Parameters<typeof ShimProcess.start>[0] = {}): Promise<ShimProcess> =>
  ShimProcess.start({ ...options, ...(bundle ? { bundle } : {}) });
const stats = new ChaosStats();
let images: TestImages;
let seq = 0;

/** A container that runs until SIGTERM, then exits 3. */
const UNTIL_TERM = ["sh", "-c", "trap 'exit 3' TERM; while true; do sleep 0.1; done"];

function task(
  command: string[] = UNTIL_TERM,
  extra: Record<string, unknown> = {},
): Record<string, unknown> & {
  id: string;
} {
  seq += 1;
  return {
    id: `sf-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-sf-${seq}`,
    image_name: images.busybox,
    command,
    ...extra,
  };
}

/** Counts a violation for the summary line and fails the test. */
function check(
  ok: boolean,
  category: "lost" | "wrong_exit" | "leaked_dirs" | "leaked_containers" | "other",
  what: string,
): void {
  if (!ok) stats.counts[category] += 1;
  expect(ok, what).toBe(true);
}

/** A mount the test made, undone (and its loop file deleted) by `undo`, whatever happened. */
class Mount {
  private constructor(
    readonly dir: string,
    private readonly loopFile?: string,
    private readonly binds: string[] = [],
  ) {}

  static async tmpfs(sizeKiB: number): Promise<Mount> {
    const dir = await mkdtemp(join(tmpdir(), "taskshim-sf-tmpfs-"));
    await exec("mount", ["-t", "tmpfs", "-o", `size=${sizeKiB}k,mode=0755`, "tmpfs", dir], {
      timeout: 10_000,
    });
    return new Mount(dir);
  }

  static async ext4(sizeMiB: number): Promise<Mount> {
    const dir = await mkdtemp(join(tmpdir(), "taskshim-sf-ext4-"));
    const loopFile = `${dir}.img`;
    await exec("truncate", ["-s", `${sizeMiB}M`, loopFile]);
    await exec("mkfs.ext4", ["-q", "-F", loopFile], { timeout: 30_000 });
    await exec("mount", ["-o", "loop", loopFile, dir], { timeout: 10_000 });
    // `<home>/runners` is a bind mount of itself, so it can be made read-only while the shim
    // keeps shim.log open for writing (a file system with a writer cannot be remounted ro).
    const runners = join(dir, "runners");
    await mkdir(runners, { mode: 0o755 });
    await exec("mount", ["--bind", runners, runners], { timeout: 10_000 });
    return new Mount(dir, loopFile, [runners]);
  }

  /** Makes `<home>/runners` (the task dirs) read-only or writable again. */
  async runners(mode: "ro" | "rw"): Promise<void> {
    await exec("mount", ["-o", `remount,bind,${mode}`, join(this.dir, "runners")], { timeout: 10_000 });
  }

  async remount(mode: "ro" | "rw"): Promise<void> {
    await exec("mount", ["-o", `remount,${mode}`, this.dir], { timeout: 10_000 });
  }

  async chattr(flag: "+i" | "-i", ...paths: string[]): Promise<void> {
    await exec("chattr", [flag, ...paths], { timeout: 10_000 });
  }

  async undo(): Promise<void> {
    await this.remount("rw").catch(() => undefined);
    for (const bind of this.binds) {
      await exec("umount", [bind], { timeout: 10_000 }).catch(() => exec("umount", ["-l", bind]));
    }
    if (this.loopFile) await exec("chattr", ["-R", "-i", this.dir]).catch(() => undefined);
    await exec("umount", [this.dir], { timeout: 10_000 }).catch(() => exec("umount", ["-l", this.dir]));
    if (this.loopFile) await rm(this.loopFile, { force: true });
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** Polls `predicate` every 100 ms for up to 5 s; fails with `what` if it never holds. */
async function eventually(what: string, predicate: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`not within 5 s: ${what}`);
    await sleep(100);
  }
}

/** Fills the file system under `dir` with one file; returns its path. */
function fill(dir: string): string {
  const path = join(dir, "filler");
  const fd = openSync(path, "w");
  const chunk = Buffer.alloc(64 * 1024);
  try {
    for (;;) writeSync(fd, chunk);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
  } finally {
    closeSync(fd);
  }
  return path;
}

interface Health {
  storage: { status: string; since: string; error?: string };
  engine: { status: string };
}

async function health(shim: ShimProcess): Promise<Health> {
  return (await shim.request<Health>("GET", "/api/healthcheck")).json;
}

async function waitStorage(
  shim: ShimProcess,
  status: "ok" | "degraded",
  timeoutMs = 10_000,
): Promise<Health> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const h = await health(shim);
    if (h.storage.status === status) return h;
    if (Date.now() > deadline)
      throw new Error(`storage not ${status} within ${timeoutMs} ms: ${JSON.stringify(h)}`);
    await sleep(100);
  }
}

async function metric(shim: ShimProcess, name: string): Promise<number> {
  const text = (await shim.request("GET", "/metrics")).text;
  const match = new RegExp(`^${name} ([0-9.e+-]+)$`, "m").exec(text);
  return Number(match?.[1] ?? NaN);
}

async function taskState(home: string, info: TaskInfo): Promise<Record<string, unknown>> {
  return JSON.parse(
    await readFile(join(home, "runners", info.container_name, "task.json"), "utf8"),
  ) as Record<string, unknown>;
}

const alive = (shim: ShimProcess): boolean => shim.child.exitCode === null && shim.child.signalCode === null;

async function containerState(id: string): Promise<{ running: boolean; exitCode: number }> {
  const info = await testDocker().getContainer(id).inspect();
  return { running: info.State.Running, exitCode: info.State.ExitCode };
}

/** SIGTERM to the task's container: it exits 3. */
async function endTask(info: TaskInfo): Promise<void> {
  await testDocker().getContainer(info.container_id).kill({ signal: "TERM" });
}

/** The API's view and task.json agree: status, reason, and the container's real exit code. */
async function expectDiskMatches(shim: ShimProcess, info: TaskInfo): Promise<void> {
  const api = await shim.task(info.id);
  const disk = await taskState(shim.home, info);
  check(
    disk.status === api.status,
    "lost",
    `${info.id}: task.json status ${String(disk.status)} vs API ${api.status}`,
  );
  check(
    disk.termination_reason === api.termination_reason,
    "lost",
    `${info.id}: task.json reason ${String(disk.termination_reason)} vs API ${api.termination_reason}`,
  );
  if (api.status === "terminated" && api.container_id !== "") {
    const { exitCode } = await containerState(api.container_id);
    check(
      disk.exit_code === exitCode,
      "wrong_exit",
      `${info.id}: task.json exit ${String(disk.exit_code)} vs ${exitCode}`,
    );
  }
}

/**
 * Nothing left behind: only the expected task dirs, none with credentials or temp files. A write
 * may still be in flight (a release's commit after the API shows `terminated`), so the look is
 * repeated for up to 3 s before it counts.
 */
async function expectNoLeaks(home: string, expected: readonly TaskInfo[]): Promise<void> {
  const runners = join(home, "runners");
  const want = expected.map((t) => t.container_name).sort();
  const look = async (): Promise<{ category: "leaked_dirs" | "other"; what: string }[]> => {
    const found: { category: "leaked_dirs" | "other"; what: string }[] = [];
    const names = await readdir(runners);
    const dirs = names.filter((n) => !n.startsWith(".")).sort();
    if (JSON.stringify(dirs) !== JSON.stringify(want))
      found.push({ category: "leaked_dirs", what: `task dirs ${dirs.join(",")} vs ${want.join(",")}` });
    const dots = names.filter((n) => n.startsWith("."));
    if (dots.length > 0)
      found.push({ category: "leaked_dirs", what: `dot entries in runners: ${dots.join(",")}` });
    for (const dir of dirs) {
      const files = await readdir(join(runners, dir));
      if (files.includes("registry-auth.json"))
        found.push({ category: "other", what: `${dir} still holds registry-auth.json` });
      if (files.some((f) => f.includes(".tmp-")))
        found.push({ category: "leaked_dirs", what: `${dir} holds temp files: ${files.join(",")}` });
    }
    return found;
  };
  const deadline = Date.now() + 3_000;
  let found = await look();
  while (found.length > 0 && Date.now() < deadline) {
    await sleep(100);
    found = await look();
  }
  for (const { category, what } of found) check(false, category, what);
}

/** Terminates and removes every task; their containers must be gone. */
async function removeAll(shim: ShimProcess, infos: readonly TaskInfo[]): Promise<void> {
  for (const info of infos) {
    expect((await shim.terminate(info.id)).status).toBe(200);
    const removed = await shim.remove(info.id);
    expect(removed.status, removed.text).toBe(200);
    if (info.container_id !== "") {
      const gone = await testDocker()
        .getContainer(info.container_id)
        .inspect()
        .then(() => false)
        .catch(() => true);
      check(gone, "leaked_containers", `${info.id}: container ${info.container_id} left behind`);
    }
  }
}

/** A submit that must fail with 503 and leave nothing. */
async function expectSubmitRefused(
  shim: ShimProcess,
  body: Record<string, unknown>,
  code: string,
): Promise<void> {
  const before = await readdir(join(shim.home, "runners")).catch(() => [] as string[]);
  const answer = await shim.request("POST", "/api/tasks", body);
  expect(answer.status, answer.text).toBe(503);
  expect(answer.contentType).toMatch(/^text\/plain/);
  expect(answer.text).toMatch(new RegExp(`^storage unavailable: ${code}: `));
  expect((await shim.request("GET", `/api/tasks/${String(body.id)}`)).status).toBe(404);
  const after = await readdir(join(shim.home, "runners")).catch(() => [] as string[]);
  check(
    JSON.stringify(after.sort()) === JSON.stringify(before.sort()),
    "leaked_dirs",
    `runners changed: ${after.join(",")}`,
  );
}

/** A terminate that must fail with 503 and change nothing: API, task.json, container. */
async function expectTerminateRefused(shim: ShimProcess, info: TaskInfo, code: string): Promise<void> {
  const answer = await shim.terminate(info.id, "terminated_by_user");
  expect(answer.status, answer.text).toBe(503);
  expect(answer.text).toMatch(new RegExp(`^storage unavailable: ${code}: `));
  // A reconcile tick later (850 ms) nothing acted on it either.
  await sleep(1_200);
  const api = await shim.task(info.id);
  check(
    api.status === "running" && api.termination_reason === "",
    "lost",
    `${info.id} changed: ${api.status}`,
  );
  const disk = await taskState(shim.home, info);
  check(disk.status === "running" && disk.termination_reason === "", "lost", `${info.id} task.json changed`);
  check((await containerState(info.container_id)).running, "lost", `${info.id}: container stopped`);
}

beforeAll(async () => {
  images = await ensureTestImages();
});

afterAll(() => {
  console.log(stats.summary());
});

describe("host storage faults never kill the shim, and no answer runs ahead of the disk", () => {
  it("S4 full disk (tmpfs ENOSPC): 503 for submit and terminate, exits final in memory, restart on the full home, catch-up once space returns", async () => {
    stats.scenarios += 1;
    const mount = await Mount.tmpfs(4 * 1024);
    let shim: ShimProcess | undefined;
    try {
      shim = await start({ home: mount.dir });
      const long = await shim.submit(task());
      const exits = await shim.submit(task());
      const longRunning = await shim.waitTask(long.id, (t) => t.status === "running");
      const exitsRunning = await shim.waitTask(exits.id, (t) => t.status === "running");

      const filler = fill(mount.dir);
      stats.storageFaults += 1;
      await expectSubmitRefused(
        shim,
        task(UNTIL_TERM, { registry_username: "user", registry_password: "secret-password" }),
        "ENOSPC",
      );
      const degraded = await waitStorage(shim, "degraded");
      expect(degraded.storage.error).toMatch(/^ENOSPC: /);
      expect(await metric(shim, "taskshim_storage_up")).toBe(0);
      const status = await exec(process.execPath, [SHIM_BUNDLE, "status", "--shim", shim.url], {
        timeout: 20_000,
      });
      expect(status.stdout).toMatch(/^storage: +degraded since \S+ \(ENOSPC: no space left on device\)$/m);
      await expectTerminateRefused(shim, longRunning, "ENOSPC");

      // An exit while the disk is full: final in memory at once, not on disk yet.
      await endTask(exitsRunning);
      const finished = await shim.waitTerminated(exits.id, 15_000);
      expect(finished.termination_reason).toBe("container_exited_with_error");
      expect((await taskState(mount.dir, exitsRunning)).status).toBe("running");
      check(alive(shim), "other", "the shim died on a full disk");
      // stdout logging is unaffected by the full disk.
      const onStdout = shim;
      await eventually("stdout has the exit", () =>
        new RegExp(`"taskId":"${exits.id}"[^\\n]*"msg":"task finished"`).test(onStdout.logs),
      );

      // A restart on the full home: it starts, restores, serves and says degraded.
      expect(await shim.stop()).toBe(0);
      shim = await start({ home: mount.dir });
      expect((await waitStorage(shim, "degraded")).storage.error).toMatch(/^ENOSPC: /);
      expect((await shim.task(long.id)).status).toBe("running");
      const rederived = await shim.waitTerminated(exits.id, 15_000);
      expect(rederived.termination_reason).toBe("container_exited_with_error");

      // Space returns: the home is ok within a probe or two, and the disk catches up.
      await rm(filler);
      const back = Date.now();
      await waitStorage(shim, "ok", 10_000);
      expect(await metric(shim, "taskshim_storage_up")).toBe(1);
      console.log(`S4: storage ok again ${Date.now() - back} ms after space returned`);
      await expectDiskMatches(shim, exitsRunning);
      await expectDiskMatches(shim, longRunning);
      expect((await taskState(mount.dir, exitsRunning)).exit_code).toBe(3);
      check(
        (await containerState(longRunning.container_id)).running,
        "lost",
        "long task's container stopped",
      );
      await expectNoLeaks(mount.dir, [longRunning, exitsRunning]);
      // The lines written while the disk was full reach shim.log once it takes writes again.
      await eventually("shim.log catches up", async () =>
        (await readFile(join(mount.dir, "shim.log"), "utf8")).includes("storage writable again"),
      );

      // A later terminate works normally.
      const terminated = await shim.terminate(long.id, "terminated_by_user", "after the fault");
      expect(terminated.status).toBe(200);
      expect(await taskState(mount.dir, longRunning)).toMatchObject({
        status: "terminated",
        termination_reason: "terminated_by_user",
      });
      await expectDiskMatches(shim, longRunning);
      await removeAll(shim, [longRunning, exitsRunning]);
      await expectNoLeaks(mount.dir, []);
    } finally {
      await shim?.stop().catch(() => shim?.kill());
      await mount.undo();
    }
  });

  it("S4 ext4: shim.log immutable (EPERM) fails no submit; task dirs immutable answer 503 EPERM; read-only remount (EROFS), a restart on it, and the catch-up", async () => {
    stats.scenarios += 1;
    const mount = await Mount.ext4(48);
    let shim: ShimProcess | undefined;
    const runners = join(mount.dir, "runners");
    try {
      shim = await start({ home: mount.dir });
      const first = await shim.submit(task());
      const a = await shim.waitTask(first.id, (t) => t.status === "running");

      // Only shim.log is unwritable: the submit is accepted and the task starts.
      stats.storageFaults += 1;
      await mount.chattr("+i", join(mount.dir, "shim.log"));
      const second = await shim.request<TaskInfo>("POST", "/api/tasks", task());
      expect(second.status, second.text).toBe(200);
      const b = await shim.waitTask(second.json.id, (t) => t.status === "running");
      expect((await health(shim)).storage.status).toBe("ok");
      await mount.chattr("-i", join(mount.dir, "shim.log"));
      await eventually("shim.log gets the lines it could not take", async () =>
        new RegExp(`"taskId":"${b.id}"[^\\n]*"msg":"task submitted"`).test(
          await readFile(join(mount.dir, "shim.log"), "utf8"),
        ),
      );

      // The task dirs are immutable (EPERM).
      stats.storageFaults += 1;
      const dirs = (await readdir(runners)).map((n) => join(runners, n));
      await mount.chattr("+i", runners, ...dirs);
      try {
        await expectSubmitRefused(shim, task(), "EPERM");
        await expectTerminateRefused(shim, a, "EPERM");
        expect((await waitStorage(shim, "degraded")).storage.error).toMatch(/^EPERM: /);
      } finally {
        await mount.chattr("-i", runners, ...dirs);
      }
      await waitStorage(shim, "ok");

      // Read-only task dirs (EROFS): refused submit and terminate, an exit final in memory.
      stats.storageFaults += 1;
      await mount.runners("ro");
      await expectSubmitRefused(shim, task(), "EROFS");
      await expectTerminateRefused(shim, a, "EROFS");
      await endTask(b);
      expect((await shim.waitTerminated(b.id, 15_000)).termination_reason).toBe(
        "container_exited_with_error",
      );
      expect((await taskState(mount.dir, b)).status).toBe("running");
      check(alive(shim), "other", "the shim died on a read-only home");
      // A restart with the whole home read-only: it starts, restores, serves, says degraded.
      expect(await shim.stop()).toBe(0);
      await mount.remount("ro");
      shim = await start({ home: mount.dir });
      expect((await waitStorage(shim, "degraded")).storage.error).toMatch(/^EROFS: /);
      expect((await shim.task(a.id)).status).toBe("running");
      expect((await shim.waitTerminated(b.id, 15_000)).termination_reason).toBe(
        "container_exited_with_error",
      );
      await expectTerminateRefused(shim, a, "EROFS");
      await mount.remount("rw");
      await mount.runners("rw");
      await waitStorage(shim, "ok");
      await expectDiskMatches(shim, a);
      await expectDiskMatches(shim, b);
      expect((await taskState(mount.dir, b)).exit_code).toBe(3);
      check((await containerState(a.container_id)).running, "lost", "task a's container stopped");
      await expectNoLeaks(mount.dir, [a, b]);
      await removeAll(shim, [a, b]);
      await expectNoLeaks(mount.dir, []);
    } finally {
      await shim?.stop().catch(() => shim?.kill());
      await mount.undo();
    }
  });

  it("S5 EIO at each durable write (failpoints): 503, nothing left, and a retry without credentials never sends the old ones", async () => {
    stats.scenarios += 1;
    const registry: LocalRegistry = await startRegistry({ username: "sf", password: "sf-secret-pass" });
    const recorder = await startRecordingProxy(registry.host);
    let shim: ShimProcess | undefined;
    let pushed: string | undefined;
    try {
      const local = await createUniqueImage();
      pushed = await registry.push(local, "sf/private", "v1");
      await testDocker().getImage(local).remove({ force: true });
      const viaProxy = pushed.replace(registry.host, recorder.host);
      shim = await start({
        env: {
          TASKSHIM_FAILPOINTS:
            "durable-write:task-dir=1*error(EIO),durable-write:registry-auth=1*error(EIO),durable-write:task-state=1*error(EIO)",
        },
      });
      const withCreds = task(["true"], {
        image_name: viaProxy,
        registry_username: registry.username,
        registry_password: registry.password,
      });
      // One EIO at each durable write of a submit: the dir, the credentials, task.json.
      for (let i = 0; i < 3; i++) {
        stats.storageFaults += 1;
        await expectSubmitRefused(shim, withCreds, "EIO");
      }
      expect((await health(shim)).storage.status).toBe("degraded");
      await waitStorage(shim, "ok");
      // The same id again without credentials: a fresh submit that must not find the old ones.
      const withoutCreds: Record<string, unknown> = { ...withCreds };
      delete withoutCreds.registry_username;
      delete withoutCreds.registry_password;
      const retried = await shim.submit(withoutCreds);
      expect(retried.status).toBe("pending");
      const failed = await shim.waitTerminated(withCreds.id, 60_000);
      expect(failed.termination_reason).toBe("creating_container_error");
      const pulls = recorder.requests.filter((r) => r.path.startsWith("/v2/"));
      expect(pulls.length).toBeGreaterThan(0);
      check(
        pulls.every((r) => r.authorization === undefined),
        "other",
        `a pull without credentials sent Authorization: ${JSON.stringify(pulls)}`,
      );
      await expectNoLeaks(shim.home, [failed]);
      await removeAll(shim, [failed]);
    } finally {
      await shim?.stop().catch(() => shim?.kill());
      await recorder.close();
      await registry.stop();
      if (pushed)
        await testDocker()
          .getImage(pushed)
          .remove({ force: true })
          .catch(() => undefined);
    }
  });
});

/** An HTTP proxy in front of the registry that records each request's Authorization header. */
async function startRecordingProxy(target: string): Promise<{
  host: string;
  requests: { path: string; authorization: string | undefined }[];
  close(): Promise<void>;
}> {
  const [targetHost, targetPort] = target.split(":");
  const requests: { path: string; authorization: string | undefined }[] = [];
  const server: Server = createServer((req, res) => {
    requests.push({ path: req.url ?? "", authorization: req.headers.authorization });
    const upstream = request(
      { host: targetHost, port: Number(targetPort), method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  const port = await freePort();
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return {
    host: `127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
