import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FenceReport } from "../src/control/fence.js";
import { TEST_LABEL, testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { freePort, SHIM_BUNDLE, ShimProcess } from "./support/shim-process.js";
import { startSilentHost, type SilentHost } from "./support/silent-host.js";

/**
 * `taskshim fence` against real parts the test starts itself: Debian's sshd on 127.0.0.1 at a
 * free port (generated host and client keys, host key checked against a generated known_hosts), a
 * TCP listener that accepts and never speaks, containers that ignore SIGTERM, and a real shim
 * stopped with SIGSTOP.
 */

const LABEL_IS_TASK = "ai.dstack.shim.is-task";
const LABEL_TASK_ID = "ai.dstack.shim.task-id";
/** Narrows `--all` to this file's containers: the engine is shared with other tests and shims. */
const FENCE_LABEL = "taskshim.test.fence";
const RUN = randomBytes(4).toString("hex");

let images: TestImages;
let sshDir: string;
let sshd: ChildProcess;
let sshPort: number;

interface FenceRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly ms: number;
}

function runFence(args: readonly string[]): Promise<FenceRun> {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [SHIM_BUNDLE, "fence", ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    child.once("close", (code) => resolve({ code, stdout, stderr, ms: Date.now() - started }));
  });
}

/** The `--ssh` flags for the test's sshd, host key checked against the generated known_hosts. */
function sshFlags(): string[] {
  return [
    "--ssh",
    `root@127.0.0.1:${sshPort}`,
    "--identity",
    join(sshDir, "client_key"),
    "--ssh-option",
    "StrictHostKeyChecking=yes",
    "--ssh-option",
    `UserKnownHostsFile=${join(sshDir, "known_hosts")}`,
  ];
}

async function run(command: string, args: string[]): Promise<void> {
  const child = spawn(command, args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
  const code = await new Promise<number | null>((resolve) => child.once("close", resolve));
  if (code !== 0) throw new Error(`${command} ${args.join(" ")}: exit ${code}: ${stderr}`);
}

async function startSshd(): Promise<void> {
  sshDir = await mkdtemp(join(tmpdir(), "fence-sshd-"));
  sshPort = await freePort();
  for (const key of ["host_key", "client_key"]) {
    await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", `fence-${key}`, "-f", join(sshDir, key)]);
  }
  const hostKey = (await readFile(join(sshDir, "host_key.pub"), "utf8")).split(" ").slice(0, 2).join(" ");
  await writeFile(join(sshDir, "known_hosts"), `[127.0.0.1]:${sshPort} ${hostKey}\n`);
  await writeFile(join(sshDir, "authorized_keys"), await readFile(join(sshDir, "client_key.pub")));
  await writeFile(
    join(sshDir, "sshd_config"),
    [
      `Port ${sshPort}`,
      "ListenAddress 127.0.0.1",
      `HostKey ${join(sshDir, "host_key")}`,
      `PidFile ${join(sshDir, "sshd.pid")}`,
      `AuthorizedKeysFile ${join(sshDir, "authorized_keys")}`,
      "StrictModes no",
      "PasswordAuthentication no",
      "KbdInteractiveAuthentication no",
      "UsePAM no",
      "PermitRootLogin prohibit-password",
      "",
    ].join("\n"),
  );
  // sshd's privilege separation directory.
  await mkdir("/run/sshd", { recursive: true, mode: 0o755 });
  sshd = spawn("/usr/sbin/sshd", ["-D", "-e", "-f", join(sshDir, "sshd_config")], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  sshd.stderr?.on("data", (chunk: Buffer) => (log += chunk.toString("utf8")));
  const until = Date.now() + 10_000;
  for (;;) {
    if (sshd.exitCode !== null) throw new Error(`sshd exited ${sshd.exitCode}: ${log}`);
    const banner = await new Promise<string>((resolve) => {
      const socket = new Socket();
      socket.once("data", (data) => {
        socket.destroy();
        resolve(data.toString("utf8"));
      });
      socket.once("error", () => resolve(""));
      socket.connect(sshPort, "127.0.0.1");
    });
    if (banner.startsWith("SSH-")) return;
    if (Date.now() > until) throw new Error(`sshd did not answer within 10 s: ${log}`);
    await sleep(100);
  }
}

/** A running task container as a shim makes them (task label, task id), here made by hand. */
async function taskContainer(taskId: string, options: { ignoreTerm?: boolean; taskLabel?: boolean } = {}) {
  const name = `tst-fence-${RUN}-${randomBytes(3).toString("hex")}`;
  const container = await testDocker().createContainer({
    name,
    Image: images.busybox,
    // `trap '' TERM`: a docker stop would wait its whole grace period for this one.
    Cmd: options.ignoreTerm ? ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"] : ["sleep", "300"],
    Labels: {
      [TEST_LABEL]: "1",
      [FENCE_LABEL]: RUN,
      ...(options.taskLabel === false ? {} : { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: taskId }),
    },
  });
  await container.start();
  return { id: container.id, name };
}

async function exists(id: string): Promise<boolean> {
  try {
    await testDocker().getContainer(id).inspect();
    return true;
  } catch (error) {
    if ((error as { statusCode?: number }).statusCode === 404) return false;
    throw error;
  }
}

beforeAll(async () => {
  images = await ensureTestImages();
  await startSshd();
});

afterAll(async () => {
  sshd?.kill("SIGKILL");
  if (sshDir) await rm(sshDir, { recursive: true, force: true });
});

describe("taskshim fence: usage", () => {
  it("exits 2 for a command line it cannot use, and touches nothing", async () => {
    const noTarget = await runFence(["--all"]);
    expect(noTarget.code).toBe(2);
    expect(noTarget.stderr).toContain("taskshim: fence: say where");
    expect(noTarget.stdout).toBe("");
    expect((await runFence(["--local", "--all", "--bogus"])).code).toBe(2);
    expect((await runFence(["--local", "--all", "--task", "x"])).code).toBe(2);
  });
});

describe("taskshim fence --ssh: the docker CLI over a real sshd", () => {
  it("--all removes every task container (one ignores SIGTERM), never one without the task label", async () => {
    const a = await taskContainer(`task-a-${RUN}`, { ignoreTerm: true });
    const b = await taskContainer(`task-b-${RUN}`);
    const foreign = await taskContainer("", { taskLabel: false });
    const fenced = await runFence([...sshFlags(), "--all", "--label", `${FENCE_LABEL}=${RUN}`, "--json"]);
    expect(fenced.stderr).toBe("");
    expect(fenced.code).toBe(0);
    const report = JSON.parse(fenced.stdout) as Record<string, unknown> & {
      results: Record<string, unknown>[];
    };
    expect(Object.keys(report).sort()).toEqual(["confirmed", "host", "results", "via"]);
    expect(report).toMatchObject({ host: `root@127.0.0.1:${sshPort}`, via: "ssh", confirmed: true });
    const results = [...report.results].sort((x, y) => String(x.task_id).localeCompare(String(y.task_id)));
    expect(results).toEqual([
      {
        container: a.name,
        task_id: `task-a-${RUN}`,
        outcome: "removed",
        reason: null,
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: a.id },
      },
      {
        container: b.name,
        task_id: `task-b-${RUN}`,
        outcome: "removed",
        reason: null,
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: b.id },
      },
    ]);
    // SIGKILL, not a stop: the container that ignores SIGTERM did not cost a grace period.
    expect(
      Number(results[0]?.evidence && (results[0].evidence as { elapsed_ms: number }).elapsed_ms),
    ).toBeLessThan(8_000);
    expect(await exists(a.id)).toBe(false);
    expect(await exists(b.id)).toBe(false);
    expect(await exists(foreign.id)).toBe(true);
    await testDocker().getContainer(foreign.id).remove({ force: true });
  });

  it("--task removes only that task's container; an unknown task is already absent", async () => {
    const keep = await taskContainer(`task-keep-${RUN}`);
    const target = await taskContainer(`task-target-${RUN}`);
    const fenced = await runFence([
      ...sshFlags(),
      "--task",
      `task-target-${RUN}`,
      "--task",
      `nope-${RUN}`,
      "--json",
    ]);
    expect(fenced.code).toBe(0);
    const report = JSON.parse(fenced.stdout) as { confirmed: boolean; results: Record<string, unknown>[] };
    expect(report.confirmed).toBe(true);
    expect(report.results).toEqual([
      expect.objectContaining({ container: target.name, task_id: `task-target-${RUN}`, outcome: "removed" }),
      expect.objectContaining({
        container: null,
        task_id: `nope-${RUN}`,
        outcome: "already_absent",
        reason: null,
      }),
    ]);
    expect(await exists(target.id)).toBe(false);
    expect(await exists(keep.id)).toBe(true);
    await testDocker().getContainer(keep.id).remove({ force: true });
  });

  it("prints a table and exits 1 when the host key does not match", async () => {
    const target = await taskContainer(`task-hostkey-${RUN}`);
    const wrongKnownHosts = join(sshDir, "wrong_known_hosts");
    const otherKey = (await readFile(join(sshDir, "client_key.pub"), "utf8"))
      .split(" ")
      .slice(0, 2)
      .join(" ");
    await writeFile(wrongKnownHosts, `[127.0.0.1]:${sshPort} ${otherKey}\n`);
    const flags = sshFlags().map((f) =>
      f.startsWith("UserKnownHostsFile=") ? `UserKnownHostsFile=${wrongKnownHosts}` : f,
    );
    const fenced = await runFence([...flags, "--task", `task-hostkey-${RUN}`]);
    expect(fenced.code).toBe(1);
    expect(fenced.stdout).toMatch(/^CONTAINER\s+TASK ID\s+OUTCOME\s+DETAIL\n/);
    expect(fenced.stdout).toMatch(
      new RegExp(`-\\s+task-hostkey-${RUN}\\s+unconfirmed\\s+ssh: .*Host key verification failed`),
    );
    expect(fenced.stdout).toContain(`NOT confirmed: 1 result(s) via ssh on root@127.0.0.1:${sshPort}`);
    // Unconfirmed, and really still there.
    expect(await exists(target.id)).toBe(true);
    await testDocker().getContainer(target.id).remove({ force: true });
  });
});

describe("taskshim fence: a host that accepts and never speaks", () => {
  let silent: SilentHost;
  let port = 0;

  beforeAll(async () => {
    silent = await startSilentHost();
    port = silent.port;
  });

  afterAll(() => silent.close());

  it("ends unconfirmed at --deadline with the killed ssh client's evidence; the container is still there", async () => {
    const target = await taskContainer(`task-silent-${RUN}`);
    const fenced = await runFence([
      "--ssh",
      `127.0.0.1:${port}`,
      "--task",
      `task-silent-${RUN}`,
      "--deadline",
      "2s",
      "--json",
    ]);
    expect(fenced.code).toBe(1);
    // The bound (2 s) plus the cleanup; ssh's own ConnectTimeout (10 s) never came into play.
    expect(fenced.ms).toBeGreaterThanOrEqual(2_000);
    expect(fenced.ms).toBeLessThan(6_000);
    const report = JSON.parse(fenced.stdout) as FenceReport;
    expect(report).toEqual({
      host: `127.0.0.1:${port}`,
      via: "ssh",
      confirmed: false,
      results: [
        {
          container: null,
          task_id: `task-silent-${RUN}`,
          outcome: "unconfirmed",
          reason: "deadline",
          evidence: {
            operation_elapsed_ms: expect.any(Number) as number,
            detail: expect.stringMatching(
              /^listing the task containers: deadline exceeded after \d+ ms$/,
            ) as unknown,
            cleanup: expect.objectContaining({
              trigger: "deadline",
              kill_attempted: true,
              verified: true,
              error: null,
            }) as unknown,
          },
        },
      ],
    });
    expect(silent.accepted()).toBeGreaterThanOrEqual(1);
    expect(await exists(target.id)).toBe(true);
    await testDocker().getContainer(target.id).remove({ force: true });
  });
});

describe("taskshim fence --shim: the shim's API, and SSH when it does not answer", () => {
  let shim: ShimProcess;

  beforeAll(async () => {
    shim = await ShimProcess.start();
  });

  afterAll(async () => {
    shim.child.kill("SIGCONT");
    await shim.stop();
  });

  async function runningTask(): Promise<{ id: string; container: string }> {
    const id = `fence-${RUN}-${randomBytes(3).toString("hex")}`;
    await shim.submit({
      id,
      name: `tst-fence-${RUN}`,
      image_name: images.busybox,
      command: ["sleep", "300"],
    });
    const task = await shim.waitTask(id, (t) => t.status === "running", 60_000, 100);
    return { id, container: task.container_name };
  }

  it("terminates, removes and confirms through the API", async () => {
    const task = await runningTask();
    const fenced = await runFence(["--shim", shim.url, "--task", task.id, "--json"]);
    expect(fenced.code).toBe(0);
    const report = JSON.parse(fenced.stdout) as FenceReport;
    expect(report).toEqual({
      host: `127.0.0.1:${shim.port}`,
      via: "api",
      confirmed: true,
      results: [
        {
          container: task.container,
          task_id: task.id,
          outcome: "removed",
          reason: null,
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: ["terminate: terminated", "remove: ok", "confirm: 404"],
          },
        },
      ],
    });
    expect((await shim.request("GET", `/api/tasks/${task.id}`)).status).toBe(404);
    expect(await exists(task.container)).toBe(false);
  });

  it("falls back to SSH when the shim is stopped (SIGSTOP) and does not answer within the deadline", async () => {
    const task = await runningTask();
    shim.child.kill("SIGSTOP");
    try {
      const fenced = await runFence([
        "--shim",
        shim.url,
        ...sshFlags(),
        "--task",
        task.id,
        "--deadline",
        "3s",
        "--json",
      ]);
      expect(fenced.code).toBe(0);
      // The shim had its whole deadline to answer first.
      expect(fenced.ms).toBeGreaterThanOrEqual(3_000);
      const report = JSON.parse(fenced.stdout) as FenceReport;
      expect(report).toEqual({
        host: `root@127.0.0.1:${sshPort}`,
        via: "ssh",
        confirmed: true,
        results: [
          expect.objectContaining({
            container: task.container,
            task_id: task.id,
            outcome: "removed",
            reason: null,
          }),
        ],
      });
      expect(await exists(task.container)).toBe(false);
    } finally {
      shim.child.kill("SIGCONT");
    }
  });
});
