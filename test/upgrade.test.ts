import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFile, mkdir, readdir, readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { removeImagesOf, testDocker } from "./support/docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import { freePort, tempHome, upgradeArgv, type TaskInfo } from "./support/shim-process.js";
import { startSlowProxy, type SlowProxy } from "./support/slow-proxy.js";

/*
 * The fleet upgrade (docs/fault-matrix.md U1) end to end, on the single binaries built from the
 * pinned Node.js (scripts/build-binary.mjs): shim A
 * runs under `taskshim supervise`; tasks pull (from a deliberately
 * slow registry), run, and exit; `taskshim upgrade` rolls out B (another version, writing a
 * newer state format), then rolls back to A. Every task survives both, exits during the
 * windows are finalized with their real codes, and B's state files are left alone by A.
 */

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");

let images: TestImages;
let registry: LocalRegistry;
let proxy: SlowProxy;
let work: string;
let supervisor: ChildProcess | undefined;
let supervisorLog = "";
let url = "";
const binaries: Record<"A" | "B", { path: string; sha256: string; version: string }> = {
  A: { path: "", sha256: "", version: "1.0.0" },
  B: { path: "", sha256: "", version: "1.1.0" },
};

/**
 * A GET on a new connection each time: what the held socket guarantees is that a connection is
 * never refused across the handoff. (A keep-alive connection to the old process is closed when
 * it shuts down, and a request racing that close fails as on any HTTP server; clients retry.)
 */
async function get<T>(path: string): Promise<{ status: number; json: T; text: string }> {
  const response = await fetch(`${url}${path}`, {
    signal: AbortSignal.timeout(5_000),
    headers: { connection: "close" },
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

async function post(path: string, body: unknown): Promise<{ status: number; text: string }> {
  const response = await fetch(`${url}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
    signal: AbortSignal.timeout(5_000),
  });
  return { status: response.status, text: await response.text() };
}

async function waitTask(
  id: string,
  predicate: (t: TaskInfo) => boolean,
  timeoutMs = 60_000,
): Promise<TaskInfo> {
  const deadline = Date.now() + timeoutMs;
  let last: TaskInfo | undefined;
  while (Date.now() < deadline) {
    const answer = await get<TaskInfo>(`/api/tasks/${id}`).catch(() => undefined);
    if (answer?.status === 200) {
      last = answer.json;
      if (predicate(last)) return last;
    }
    await sleep(50);
  }
  throw new Error(`task ${id}: ${JSON.stringify(last)}\n${supervisorLog.slice(-4000)}`);
}

/** How many times the supervisor has seen its shim exit (each upgrade handoff is one). */
const shimExits = (): number => supervisorLog.split('"msg":"shim exited; restarting"').length - 1;

/**
 * Runs `taskshim upgrade` to `target` while touching `onDown()` as soon as the old shim has
 * exited, and a steady client (a healthcheck every 20 ms) counts refused requests: the
 * supervisor holds the API socket, so there must be none.
 */
async function rollOut(
  target: "A" | "B",
  onDown: () => Promise<void>,
): Promise<{ windowMs: number; table: string; refused: number; answered: number }> {
  const binary = binaries[target];
  const cli = exec(process.execPath, upgradeArgv(url, binary), { timeout: 120_000 });
  let fired = false;
  let refused = 0;
  let answered = 0;
  const failures: string[] = [];
  const exitsBefore = shimExits();
  const client = (async () => {
    while (!fired) {
      await get("/api/healthcheck").then(
        () => answered++,
        (error: unknown) => {
          refused++;
          const cause = (error as { cause?: { code?: string; message?: string } }).cause;
          failures.push(cause?.code ?? cause?.message ?? String(error));
        },
      );
      await sleep(20);
    }
  })();
  const watcher = (async () => {
    while (!fired && shimExits() === exitsBefore) await sleep(5);
    if (!fired) await onDown();
  })();
  const { stdout } = await cli;
  await watcher;
  fired = true;
  await client;
  const [result] = JSON.parse(stdout) as {
    outcome: string;
    windowMs: number;
    tasksBefore: number;
    tasksKept: number;
  }[];
  expect(result?.outcome).toBe("upgraded");
  expect(result?.tasksKept).toBe(result?.tasksBefore);
  if (failures.length > 0) console.log(`steady client failures (${target}): ${failures.join(", ")}`);
  return { windowMs: result?.windowMs ?? -1, table: stdout, refused, answered };
}

/** Builds the single binary `taskshim-A|B` from the pinned Node.js (scripts/build-binary.mjs). */
async function buildBinary(name: "A" | "B", stateVersion?: number): Promise<void> {
  const path = join(work, `taskshim-${name}`);
  await exec(
    process.execPath,
    [
      join(ROOT, "scripts/build-binary.mjs"),
      "--outfile",
      path,
      "--version",
      binaries[name].version,
      ...(stateVersion ? ["--state-version", String(stateVersion)] : []),
    ],
    { cwd: ROOT },
  );
  binaries[name].path = path;
  binaries[name].sha256 = createHash("sha256")
    .update(await readFile(path))
    .digest("hex");
}

beforeAll(async () => {
  images = await ensureTestImages();
  work = await tempHome("taskshim-upgrade-");
  await buildBinary("A");
  await buildBinary("B", 2);
  // The binaries embed the Node.js these tests run on (the pinned one), flags included.
  const { stdout, stderr } = await exec(binaries.A.path, ["--version"]);
  expect(stdout.trim()).toBe("taskshim version 1.0.0");
  // Nothing else: its startup snapshot was made under its own flags.
  expect(stderr).toBe("");
  const runtime = JSON.parse((await exec(binaries.B.path, ["version", "--json"])).stdout) as Record<
    string,
    unknown
  >;
  expect(runtime).toEqual({
    version: "1.1.0",
    commit: expect.any(String) as unknown,
    dirty: expect.any(Boolean) as unknown,
    build_id: expect.stringMatching(/^[0-9a-f]{20}$/) as unknown,
    node: process.versions.node,
    v8: process.versions.v8,
    platform: process.platform,
    arch: process.arch,
  });
  // Another version, so another bundle: another build id, without being told (scripts/build.mjs).
  const runtimeA = JSON.parse((await exec(binaries.A.path, ["version", "--json"])).stdout) as Record<
    string,
    unknown
  >;
  expect(runtimeA.build_id).toMatch(/^[0-9a-f]{20}$/);
  expect(runtimeA.build_id).not.toBe(runtime.build_id);
  registry = await startRegistry({ username: "upgrader", password: "pw-upgrade" });
  proxy = await startSlowProxy(registry.host, 256 * 1024);

  const bin = join(work, "bin");
  await mkdir(bin);
  const installed = join(bin, "taskshim");
  await copyFile(binaries.A.path, installed);
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  // No node anywhere: the supervisor is binary A itself, and it runs the installed binary.
  supervisor = spawn(
    binaries.A.path,
    [
      "supervise",
      "--binary",
      installed,
      "--",
      "--shim-home",
      join(work, "home"),
      "--shim-http-port",
      String(port),
      "--shim-binary-path",
      installed,
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  supervisor.stdout?.on("data", (c: Buffer) => (supervisorLog += c.toString()));
  supervisor.stderr?.on("data", (c: Buffer) => (supervisorLog += c.toString()));
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if ((await get("/api/healthcheck").catch(() => undefined))?.status === 200) return;
    await sleep(50);
  }
  throw new Error(`shim A did not start:\n${supervisorLog}`);
});

afterAll(async () => {
  supervisor?.kill("SIGTERM");
  await sleep(1_000);
  await proxy?.close();
  if (proxy) await removeImagesOf(proxy.host);
  await registry?.stop();
});

describe("U1/U3 upgrade at any moment", () => {
  it("rolls out B and back to A with every task kept, exits finalized with real codes, B's state left alone", async () => {
    const stamp = Date.now().toString(36);
    const task = (label: string, extra: Record<string, unknown>) => ({
      id: `up-${label}-${stamp}`,
      name: `tst-up-${label}`,
      image_name: images.busybox,
      ...extra,
    });
    const longRunner = task("long", { command: ["sleep", "300"] });
    const exitsInWindow = task("exit1", {
      command: [
        "sh",
        "-c",
        "while [ ! -e /tmp/runner/go ]; do sleep 0.05; done; echo bye-from-window; exit 3",
      ],
    });
    const exitsInRollback = task("exit2", {
      command: [
        "sh",
        "-c",
        "while [ ! -e /tmp/runner/go ]; do sleep 0.05; done; echo bye-from-rollback; exit 4",
      ],
    });
    const finished = task("done", { command: ["true"] });
    const local = await createUniqueImage();
    await registry.push(local, "team/slow", "v1");
    await testDocker().getImage(local).remove({ force: true });
    const pulling = task("pull", {
      image_name: `${proxy.host}/team/slow:v1`,
      registry_username: registry.username,
      registry_password: registry.password,
      command: ["sleep", "300"],
    });

    for (const t of [longRunner, exitsInWindow, exitsInRollback, finished]) {
      expect((await post("/api/tasks", t)).status).toBe(200);
    }
    const long = await waitTask(longRunner.id, (t) => t.status === "running");
    const exit1 = await waitTask(exitsInWindow.id, (t) => t.status === "running");
    const exit2 = await waitTask(exitsInRollback.id, (t) => t.status === "running");
    await waitTask(finished.id, (t) => t.status === "terminated");
    expect((await post("/api/tasks", pulling)).status).toBe(200);
    await waitTask(
      pulling.id,
      (t) => t.status === "pulling" && (t.image_pull_progress?.downloaded_bytes ?? 0) > 0,
    );
    const startedAt = (await testDocker().getContainer(long.container_id).inspect()).State.StartedAt;

    const touch = (containerId: string) => async () => {
      const exec1 = await testDocker()
        .getContainer(containerId)
        .exec({ Cmd: ["touch", "/tmp/runner/go"] });
      await exec1.start({});
    };

    // A → B, while a pull is in flight; one task exits while no shim is up.
    const forward = await rollOut("B", touch(exit1.container_id));
    expect((await get<{ version: string }>("/api/healthcheck")).json.version).toBe("1.1.0");
    const exited1 = await waitTask(exitsInWindow.id, (t) => t.status === "terminated");
    expect(exited1.termination_reason).toBe("container_exited_with_error");
    expect(exited1.termination_message).toBe("bye-from-window");
    const pulled = await waitTask(pulling.id, (t) => t.status === "running", 90_000);
    expect(pulled.image_pull_progress?.total_bytes).toBeGreaterThan(0);

    // B → A: A cannot read what B wrote in its newer format, and must leave it alone.
    const runners = join(work, "home", "runners");
    const newer = new Map<string, string>();
    for (const dir of await readdir(runners)) {
      const text = await readFile(join(runners, dir, "task.json"), "utf8").catch(() => "");
      if (text.includes('"version":2')) newer.set(dir, text);
    }
    expect(newer.size).toBeGreaterThan(0);
    const backward = await rollOut("A", touch(exit2.container_id));
    expect((await get<{ version: string }>("/api/healthcheck")).json.version).toBe("1.0.0");

    const exited2 = await waitTask(exitsInRollback.id, (t) => t.status === "terminated");
    expect(exited2.termination_reason).toBe("container_exited_with_error");
    expect(exited2.termination_message).toBe("bye-from-rollback");
    for (const [dir, text] of newer)
      expect(await readFile(join(runners, dir, "task.json"), "utf8")).toBe(text);
    const metrics = await get<undefined>("/metrics");
    expect(metrics.text).toMatch(/taskshim_quarantined_state_files\{kind="newer-format"\} [1-9]/);
    expect(supervisorLog).toContain("task state of a newer format left alone");

    const ids = [longRunner, exitsInWindow, exitsInRollback, finished, pulling].map((t) => t.id);
    const listed = new Set(
      (await get<{ tasks: { id: string }[] }>("/api/tasks")).json.tasks.map((t) => t.id),
    );
    const survived = ids.filter((id) => listed.has(id)).length;
    const stillRunning = await waitTask(longRunner.id, (t) => t.status === "running");
    expect(stillRunning.container_id).toBe(long.container_id);
    expect((await testDocker().getContainer(long.container_id).inspect()).State.StartedAt).toBe(startedAt);
    expect((await get<TaskInfo>(`/api/tasks/${finished.id}`)).json.termination_reason).toBe("done_by_runner");
    console.log(
      `upgrade: window A→B ${forward.windowMs} ms, B→A ${backward.windowMs} ms; tasks survived ${survived}/${ids.length} (running before: 4); ` +
        `steady client: ${forward.refused + backward.refused} refused of ${forward.refused + backward.refused + forward.answered + backward.answered}`,
    );
    expect(forward.refused + backward.refused).toBe(0);
    expect(survived).toBe(ids.length);

    for (const id of [longRunner.id, pulling.id]) {
      const container = (await get<TaskInfo>(`/api/tasks/${id}`)).json.container_id;
      if (container)
        await testDocker()
          .getContainer(container)
          .remove({ force: true })
          .catch(() => undefined);
    }
  });
});
