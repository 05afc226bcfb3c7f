import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFile, mkdir, readdir, readFile, rename } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { removeImagesOf, testDocker } from "./support/docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import { previousRelease, releaseBinary, type Release } from "./support/releases.js";
import { freePort, tempHome, upgradeArgv } from "./support/shim-process.js";
import { startSlowProxy, type SlowProxy } from "./support/slow-proxy.js";

/*
 * Upgrade and rollback between real releases (docs/fault-matrix.md U8): the previous release's
 * single binary, built from its own tag with its own `npm ci` (test/support/releases.ts, cached
 * across runs), runs under its own `taskshim supervise` with tasks in every status it can hold.
 * The build under test is rolled out with `taskshim upgrade`, rolled back to the release with the
 * same command, and rolled out again (graceful handovers); then the same round trip is made by
 * swapping the binary and SIGKILLing the running shim. At every step every task is present with
 * the same status, reason, message, exit code and times (or, for a task that exits while no shim
 * runs, its real end); the long container is untouched; every release happened exactly once;
 * nothing is quarantined; and the fields of every task.json survive the round trip.
 */

const exec = promisify(execFile);
const t0 = performance.now();
const step = (what: string): void =>
  console.log(`release upgrade: ${what} at ${Math.round(performance.now() - t0)} ms`);
const ROOT = resolve(import.meta.dirname, "..");

interface Binary {
  readonly path: string;
  readonly sha256: string;
}
interface WireTask {
  id: string;
  status: string;
  termination_reason: string;
  termination_message: string;
  exit_code: number | null;
  created_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  container_id: string;
}

let release: Release;
let previous: Binary;
let current: Binary;
let images: TestImages;
let registry: LocalRegistry;
let proxy: SlowProxy;
let work: string;
let home: string;
let installed: string;
let url = "";
let supervisor: ChildProcess | undefined;
let supervisorLog = "";

async function binaryAt(path: string): Promise<Binary> {
  return {
    path,
    sha256: createHash("sha256")
      .update(await readFile(path))
      .digest("hex"),
  };
}

async function api<T>(path: string, body?: unknown): Promise<{ status: number; json: T; text: string }> {
  const response = await fetch(`${url}${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { connection: "close", ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(5_000),
  });
  const text = await response.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, json: json as T, text };
}

async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    await sleep(100);
  }
  throw new Error(`${what}: not within ${timeoutMs} ms\n${supervisorLog.slice(-4000)}`);
}

const task = (id: string) =>
  waitFor(`task ${id}`, async () => {
    const answer = await api<WireTask>(`/api/tasks/${id}`);
    return answer.status === 200 ? answer.json : undefined;
  });
const waitStatus = (id: string, status: string, timeoutMs?: number) =>
  waitFor(
    `task ${id} ${status}`,
    async () => {
      const answer = await api<WireTask>(`/api/tasks/${id}`);
      return answer.status === 200 && answer.json.status === status ? answer.json : undefined;
    },
    timeoutMs,
  );

/** What must not change across a handover, per task. */
const SNAPSHOT_FIELDS = [
  "status",
  "termination_reason",
  "termination_message",
  "exit_code",
  "created_at",
  "started_at",
  "finished_at",
  "container_id",
] as const;

/** The times in order, or not: the release under test keeps them so (an older one may not have). */
const ordered = (t: Partial<WireTask>): boolean => {
  const times = [t.created_at, t.started_at, t.finished_at]
    .filter((x) => typeof x === "string")
    .map(Date.parse);
  return times.every((x, i) => i === 0 || (times[i - 1] ?? x) <= x);
};

async function snapshot(
  ids: readonly string[],
  byRelease = false,
): Promise<Record<string, Partial<WireTask>>> {
  const listed = new Set((await api<{ tasks: { id: string }[] }>("/api/tasks")).json.tasks.map((t) => t.id));
  const out: Record<string, Partial<WireTask>> = {};
  for (const id of ids) {
    expect(listed.has(id), `${id} listed`).toBe(true);
    const info = await task(id);
    out[id] = Object.fromEntries(SNAPSHOT_FIELDS.map((f) => [f, info[f]]));
    if (!byRelease) expect(ordered(info), `${id}: created_at ≤ started_at ≤ finished_at`).toBe(true);
  }
  return out;
}

/** Every key each task.json holds, top level and config, by task dir. */
async function stateKeys(): Promise<Record<string, string[]>> {
  const runners = join(home, "runners");
  const out: Record<string, string[]> = {};
  for (const dir of await readdir(runners)) {
    const text = await readFile(join(runners, dir, "task.json"), "utf8").catch(() => undefined);
    if (text === undefined) continue;
    const raw = JSON.parse(text) as Record<string, unknown>;
    out[dir] = [...Object.keys(raw), ...Object.keys(raw.config as object).map((k) => `config.${k}`)].sort();
  }
  return out;
}

async function healthVersion(): Promise<{ version: string; build_id: string | undefined }> {
  const health = (await api<{ version: string; build?: { build_id: string } }>("/api/healthcheck")).json;
  return { version: health.version, build_id: health.build?.build_id };
}

/** `taskshim upgrade` of the build under test, to `binary`: its JSON result. */
async function roll(binary: Binary): Promise<Record<string, unknown>> {
  const { stdout } = await exec(process.execPath, upgradeArgv(url, binary), { timeout: 180_000 });
  const [result] = JSON.parse(stdout) as Record<string, unknown>[];
  expect(result, stdout).toMatchObject({ outcome: "upgraded" });
  return result ?? {};
}

const shimPid = (): number => {
  const pids = [...supervisorLog.matchAll(/"msg":"shim started","run":\d+,"pid":(\d+)/g)].map((m) =>
    Number(m[1]),
  );
  const pid = pids.at(-1);
  if (pid === undefined) throw new Error(`no shim pid in the supervisor's log:\n${supervisorLog}`);
  return pid;
};

/** Swaps the installed binary and SIGKILLs the running shim; the supervisor starts the new one. */
async function killInto(binary: Binary, whileDown: () => Promise<void>): Promise<void> {
  const before = shimPid();
  await copyFile(binary.path, `${installed}.swap`);
  await rename(`${installed}.swap`, installed);
  process.kill(before, "SIGKILL");
  await whileDown();
  await waitFor(
    "a new shim after SIGKILL",
    () => Promise.resolve(shimPid() !== before ? true : undefined),
    30_000,
  );
  await waitFor("the API after SIGKILL", async () =>
    (await api("/api/healthcheck")).status === 200 ? true : undefined,
  );
}

const touch = (containerId: string, file: string) => async (): Promise<void> => {
  const run = await testDocker()
    .getContainer(containerId)
    .exec({ Cmd: ["touch", `/tmp/runner/${file}`] });
  await run.start({});
};

beforeAll(async () => {
  release = await previousRelease();
  previous = await binaryAt(await releaseBinary(release));
  images = await ensureTestImages();
  work = await tempHome("taskshim-release-");
  home = join(work, "home");
  const built = join(work, "taskshim-current");
  await exec(process.execPath, [join(ROOT, "scripts/build-binary.mjs"), "--outfile", built], { cwd: ROOT });
  current = await binaryAt(built);
  registry = await startRegistry({ username: "releaser", password: "pw-release" });
  proxy = await startSlowProxy(registry.host, 256 * 1024);

  await mkdir(join(work, "bin"));
  installed = join(work, "bin", "taskshim");
  await copyFile(previous.path, installed);
  url = `http://127.0.0.1:${await freePort()}`;
  // The release supervises itself, as on a host that runs it: the build under test only arrives
  // through the upgrade.
  supervisor = spawn(
    previous.path,
    [
      "supervise",
      "--binary",
      installed,
      "--",
      "--shim-home",
      home,
      "--shim-http-port",
      new URL(url).port,
      "--shim-binary-path",
      installed,
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  supervisor.stdout?.on("data", (c: Buffer) => (supervisorLog += c.toString()));
  supervisor.stderr?.on("data", (c: Buffer) => (supervisorLog += c.toString()));
  await waitFor(
    "the release's API",
    async () => ((await api("/api/healthcheck")).status === 200 ? true : undefined),
    30_000,
  );
}, 20 * 60_000);

afterAll(async () => {
  supervisor?.kill("SIGTERM");
  await sleep(1_000);
  await proxy?.close();
  if (proxy) await removeImagesOf(proxy.host);
  await registry?.stop();
});

describe("U8 upgrade and rollback between real releases", () => {
  it(
    "keeps every task, its status, reason, message, exit code and times, across upgrade, rollback and upgrade, graceful and SIGKILLed",
    async () => {
      // 1.0.0 reported no build id; later releases report theirs, which the build under test must not share.
      const releaseBuild = await healthVersion();
      expect(releaseBuild.version).toBe(release.version);
      const stamp = Date.now().toString(36);
      const spec = (label: string, extra: Record<string, unknown>) => ({
        id: `rel-${label}-${stamp}`,
        name: `tst-rel-${label}`,
        image_name: images.busybox,
        ...extra,
      });
      const waitGo = (file: string, code: number) => ({
        command: [
          "sh",
          "-c",
          `while [ ! -e /tmp/runner/${file} ]; do sleep 0.05; done; echo bye-${file}; exit ${code}`,
        ],
      });
      const long = spec("long", { command: ["sleep", "600"] });
      const done = spec("done", { command: ["true"] });
      const failed = spec("failed", { command: ["sh", "-c", "echo last-words; exit 7"] });
      const stopped = spec("stopped", { command: ["sleep", "600"] });
      const exitGraceful = spec("exitg", waitGo("go-graceful", 3));
      const exitKilled = spec("exitk", waitGo("go-killed", 5));
      const local = await createUniqueImage();
      await registry.push(local, "team/release", "v1");
      await testDocker().getImage(local).remove({ force: true });
      const pulling = spec("pull", {
        image_name: `${proxy.host}/team/release:v1`,
        registry_username: registry.username,
        registry_password: registry.password,
        command: ["sleep", "600"],
      });
      const all = [long, done, failed, stopped, exitGraceful, exitKilled, pulling];
      const ids = all.map((t) => t.id);

      for (const t of [long, done, failed, stopped, exitGraceful, exitKilled]) {
        expect((await api("/api/tasks", t)).status).toBe(200);
      }
      const longInfo = await waitStatus(long.id, "running");
      const graceful = await waitStatus(exitGraceful.id, "running");
      const killed = await waitStatus(exitKilled.id, "running");
      await waitStatus(stopped.id, "running");
      await waitStatus(done.id, "terminated");
      await waitStatus(failed.id, "terminated");
      expect(
        (
          await api(`/api/tasks/${stopped.id}/terminate`, {
            termination_reason: "terminated_by_user",
            termination_message: "stopped by hand",
            timeout: 0,
          })
        ).status,
      ).toBe(200);
      await waitStatus(stopped.id, "terminated");
      expect((await api("/api/tasks", pulling)).status).toBe(200);
      await waitFor("pulling", async () => {
        const info = (
          await api<WireTask & { image_pull_progress: { downloaded_bytes: number } | null }>(
            `/api/tasks/${pulling.id}`,
          )
        ).json;
        return info.status === "pulling" && (info.image_pull_progress?.downloaded_bytes ?? 0) > 0
          ? true
          : undefined;
      });
      const longStartedAt = (await testDocker().getContainer(longInfo.container_id).inspect()).State
        .StartedAt;
      const stable = [long.id, done.id, failed.id, stopped.id];
      const before = await snapshot(ids, true);
      expect(before[failed.id]).toMatchObject({
        termination_reason: "container_exited_with_error",
        exit_code: 7,
        termination_message: "last-words",
      });
      expect(before[stopped.id]).toMatchObject({
        termination_reason: "terminated_by_user",
        termination_message: "stopped by hand",
      });
      const keys = await stateKeys();

      const expectStable = async (step: string): Promise<Record<string, Partial<WireTask>>> => {
        const now = await snapshot(ids);
        for (const id of stable) {
          const was = before[id] ?? {};
          // Times the release stamped out of order (an instant exit) are put in order once, by the
          // first start of the build under test, and kept from then on (compared step to step).
          const same = ordered(was)
            ? was
            : {
                ...was,
                created_at: now[id]?.created_at,
                started_at: now[id]?.started_at,
                finished_at: now[id]?.finished_at,
              };
          expect(now[id], `${step}: ${id}`).toEqual(same);
        }
        // Every field every task.json held before is still there (a rollback drops none).
        const keysNow = await stateKeys();
        for (const [dir, held] of Object.entries(keys))
          expect(keysNow[dir], `${step}: ${dir}`).toEqual(expect.arrayContaining(held));
        return now;
      };

      step("tasks set up");
      // 1. Release → build under test (graceful); one task exits while no shim serves.
      const exitsWhileDown = touch(graceful.container_id, "go-graceful");
      const upgradeDone = roll(current);
      await waitFor(
        "the old shim to exit",
        () => Promise.resolve(supervisorLog.includes('"msg":"shim exited; restarting"') ? true : undefined),
        120_000,
      );
      await exitsWhileDown();
      const forward = await upgradeDone;
      expect(forward.compared).toBeDefined();
      const newBuild = await healthVersion();
      expect(newBuild.build_id).toMatch(/^[0-9a-f]{20}$/);
      expect(newBuild.build_id).not.toBe(releaseBuild.build_id);
      const ended = await waitStatus(exitGraceful.id, "terminated");
      expect(ended).toMatchObject({
        termination_reason: "container_exited_with_error",
        exit_code: 3,
        termination_message: "bye-go-graceful",
      });
      await waitStatus(pulling.id, "running", 120_000);
      const afterUpgrade = await expectStable("upgrade");

      step("upgraded");
      // 2. Rollback to the release with the same command, then 3. forward again.
      await roll(previous);
      expect(await healthVersion()).toEqual(releaseBuild);
      expect(await expectStable("rollback")).toEqual(afterUpgrade);
      await roll(current);
      expect(await healthVersion()).toEqual(newBuild);
      expect(await expectStable("upgrade again")).toEqual(afterUpgrade);

      step("graceful round trip done");
      // 4. The same round trip by SIGKILL: back to the release while a task exits, then forward.
      await killInto(previous, touch(killed.container_id, "go-killed"));
      expect(await healthVersion()).toEqual(releaseBuild);
      const endedKilled = await waitStatus(exitKilled.id, "terminated");
      expect(endedKilled).toMatchObject({
        termination_reason: "container_exited_with_error",
        exit_code: 5,
        termination_message: "bye-go-killed",
      });
      const afterKill = await expectStable("SIGKILL rollback");
      await killInto(current, () => Promise.resolve());
      expect(await healthVersion()).toEqual(newBuild);
      expect(await expectStable("SIGKILL upgrade")).toEqual(afterKill);

      step("SIGKILL round trip done");
      // The long container was never touched.
      const inspect = await testDocker().getContainer(longInfo.container_id).inspect();
      expect([inspect.State.Running, inspect.State.StartedAt]).toEqual([true, longStartedAt]);
      // Every terminated task released exactly once, across five processes of two releases.
      const log = await readFile(join(home, "shim.log"), "utf8");
      for (const id of [done.id, failed.id, stopped.id, exitGraceful.id, exitKilled.id]) {
        const releases = log
          .split("\n")
          .filter((l) => l.includes('"msg":"task resources released"') && l.includes(`"taskId":"${id}"`));
        expect(releases, `${id} released`).toHaveLength(1);
      }
      // Nothing quarantined, by either release.
      expect(await readdir(join(home, "quarantine")).catch(() => [])).toEqual([]);
      for (const dir of await readdir(join(home, "runners"))) {
        expect((await readdir(join(home, "runners", dir))).filter((n) => n.includes("quarantined"))).toEqual(
          [],
        );
      }
      expect((await api("/metrics")).text).toMatch(/taskshim_quarantined_state_files\{kind="corrupt"\} 0/);

      for (const id of ids) {
        const info = await task(id);
        if (info.status !== "terminated")
          await api(`/api/tasks/${id}/terminate`, {
            termination_reason: "terminated_by_user",
            termination_message: "",
            timeout: 0,
          });
        await waitStatus(id, "terminated");
        expect((await api(`/api/tasks/${id}/remove`, {})).status).toBe(200);
      }
    },
    10 * 60_000,
  );
});
