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
      // The docker CLI the SSH session runs finds the engine under test as a local one does
      // (the podman project's Podman socket); unset, it is the host's default engine.
      ...(process.env.DOCKER_HOST ? [`SetEnv DOCKER_HOST=${process.env.DOCKER_HOST}`] : []),
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

  it("O7: refuses a task id the submit would refuse (.., a slash) with exit 2 and one line, before any call", async () => {
    for (const bad of ["..", "a/b", "../terminate"]) {
      // Nothing listens on port 9: a call would show up as shim_unreachable, not as exit 2.
      const refused = await runFence(["--shim", "http://127.0.0.1:9", "--task", bad, "--json"]);
      expect(refused.code).toBe(2);
      expect(refused.stdout).toBe("");
      expect(refused.stderr).toBe(
        `taskshim: fence: invalid --task ${JSON.stringify(bad)}: a task id is letters, digits, '_', '.', ':' or '-' (at most 128)\n`,
      );
    }
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
    expect(Object.keys(report).sort()).toEqual(["confirmed", "error", "host", "results", "via"]);
    expect(report).toMatchObject({
      host: `root@127.0.0.1:${sshPort}`,
      via: "ssh",
      confirmed: true,
      error: null,
    });
    const results = [...report.results].sort((x, y) => String(x.task_id).localeCompare(String(y.task_id)));
    expect(results).toEqual([
      {
        container: a.name,
        task_id: `task-a-${RUN}`,
        outcome: "removed",
        reason: null,
        via: "ssh",
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: a.id },
      },
      {
        container: b.name,
        task_id: `task-b-${RUN}`,
        outcome: "removed",
        reason: null,
        via: "ssh",
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
    expect(fenced.stdout).toMatch(/^CONTAINER\s+TASK ID\s+VIA\s+OUTCOME\s+DETAIL\n/);
    expect(fenced.stdout).toMatch(
      new RegExp(`-\\s+task-hostkey-${RUN}\\s+ssh\\s+unconfirmed\\s+ssh: .*Host key verification failed`),
    );
    expect(fenced.stdout).toMatch(
      new RegExp(`\\nhost: root@127\\.0\\.0\\.1:${sshPort}: ssh: .*Host key verification failed`),
    );
    expect(fenced.stdout).toContain(`NOT confirmed: 1 result(s) via ssh on root@127.0.0.1:${sshPort}`);
    // Unconfirmed, and really still there.
    expect(await exists(target.id)).toBe(true);
    await testDocker().getContainer(target.id).remove({ force: true });
  });
});

describe("taskshim fence --local: labels cannot steer the listing", () => {
  it("O8: a task-id label holding a newline and another container's id: --all removes the labelled container and leaves the other", async () => {
    const victim = await taskContainer("", { taskLabel: false });
    const name = `tst-fence-${RUN}-${randomBytes(3).toString("hex")}`;
    // The rows the tab-separated listing would have read: this container's, then the victim's.
    const crafted = `x\n${victim.id}\t${victim.name}\ttask-victim-${RUN}`;
    const labelled = await testDocker().createContainer({
      name,
      Image: images.busybox,
      Cmd: ["sleep", "300"],
      Labels: { [TEST_LABEL]: "1", [FENCE_LABEL]: RUN, [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: crafted },
    });
    await labelled.start();
    const fenced = await runFence(["--local", "--all", "--label", `${FENCE_LABEL}=${RUN}`, "--json"]);
    expect(fenced.stderr).toBe("");
    expect(fenced.code).toBe(0);
    const report = JSON.parse(fenced.stdout) as FenceReport;
    expect(report).toMatchObject({ via: "local", confirmed: true, error: null });
    expect(report.results).toEqual([
      {
        container: name,
        task_id: crafted,
        outcome: "removed",
        reason: null,
        via: "local",
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: labelled.id },
      },
    ]);
    expect(await exists(labelled.id)).toBe(false);
    expect(await exists(victim.id)).toBe(true);
    expect((await testDocker().getContainer(victim.id).inspect()).State.Running).toBe(true);
    await testDocker().getContainer(victim.id).remove({ force: true });
  });
});

describe("taskshim fence: a host that cannot be listed", () => {
  it("O9: --all on a host whose ssh is refused gives the reason: a host-level error in the JSON, a table line and stderr", async () => {
    const closed = await freePort();
    const target = `root@127.0.0.1:${closed}`;
    const json = await runFence([
      "--ssh",
      target,
      "--identity",
      join(sshDir, "client_key"),
      "--all",
      "--json",
    ]);
    expect(json.code).toBe(1);
    const report = JSON.parse(json.stdout) as FenceReport;
    expect(report).toEqual({
      host: target,
      via: "ssh",
      confirmed: false,
      error: {
        reason: "ssh",
        detail: expect.stringMatching(
          /^listing the task containers: exit status 255: ssh: connect to host 127\.0\.0\.1 port \d+: Connection refused$/,
        ) as unknown,
        evidence: { code: 255, stderr: expect.stringContaining("Connection refused") as unknown },
      },
      results: [],
    });
    expect(json.stderr).toBe(
      `taskshim: fence: NOT confirmed: ${target}: ssh: ${report.error?.detail ?? ""}\n`,
    );
    const table = await runFence(["--ssh", target, "--identity", join(sshDir, "client_key"), "--all"]);
    expect(table.code).toBe(1);
    expect(table.stdout).toContain(`\nhost: ${target}: ssh: listing the task containers: exit status 255:`);
    expect(table.stdout).toContain(`NOT confirmed: 0 result(s) via ssh on ${target}`);
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
    const cleanup = expect.objectContaining({
      trigger: "deadline",
      kill_attempted: true,
      verified: true,
      error: null,
    }) as unknown;
    const detail = expect.stringMatching(
      /^listing the task containers: deadline exceeded after \d+ ms$/,
    ) as unknown;
    expect(report).toEqual({
      host: `127.0.0.1:${port}`,
      via: "ssh",
      confirmed: false,
      error: {
        reason: "deadline",
        detail,
        evidence: { operation_elapsed_ms: expect.any(Number) as number, cleanup },
      },
      results: [
        {
          container: null,
          task_id: `task-silent-${RUN}`,
          outcome: "unconfirmed",
          reason: "deadline",
          via: "ssh",
          evidence: {
            operation_elapsed_ms: expect.any(Number) as number,
            detail,
            cleanup,
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
      error: null,
      results: [
        {
          container: task.container,
          task_id: task.id,
          outcome: "removed",
          reason: null,
          via: "api",
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

  it("O7: a shim on a replaced home answers 404 for a running task: unconfirmed alone, removed through SSH when given; --all lists the engine too", async () => {
    const task = await runningTask();
    // A shim restarted on a wiped or replaced home: same engine, no knowledge of the task.
    const replaced = await ShimProcess.start();
    try {
      const alone = await runFence(["--shim", replaced.url, "--task", task.id, "--json"]);
      expect(alone.code).toBe(1);
      const aloneReport = JSON.parse(alone.stdout) as FenceReport;
      expect(aloneReport).toMatchObject({ via: "api", confirmed: false, error: null });
      expect(aloneReport.results).toEqual([
        expect.objectContaining({
          container: null,
          task_id: task.id,
          outcome: "unconfirmed",
          reason: "unknown_to_shim",
          via: "api",
        }),
      ]);
      expect((await testDocker().getContainer(task.container).inspect()).State.Running).toBe(true);

      // --all through the replaced shim alone: it lists nothing, and says the engine was not listed.
      const all = await runFence(["--shim", replaced.url, "--all", "--json"]);
      expect(all.code).toBe(1);
      expect(JSON.parse(all.stdout)).toMatchObject({
        via: "api",
        confirmed: false,
        error: { reason: "engine_not_listed" },
        results: [],
      });
      expect(all.stderr).toContain("taskshim: fence: NOT confirmed: ");
      expect(await exists(task.container)).toBe(true);

      const fenced = await runFence(["--shim", replaced.url, ...sshFlags(), "--task", task.id, "--json"]);
      expect(fenced.code).toBe(0);
      const report = JSON.parse(fenced.stdout) as FenceReport;
      expect(report).toMatchObject({
        host: `root@127.0.0.1:${sshPort}`,
        via: "ssh",
        confirmed: true,
        error: null,
      });
      expect(report.results).toEqual([
        {
          container: task.container,
          task_id: task.id,
          outcome: "removed",
          reason: null,
          via: "ssh",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            container_id: expect.stringMatching(/^[0-9a-f]{64}$/) as unknown,
            shim: expect.stringMatching(/^unknown_to_shim: /) as unknown,
          },
        },
      ]);
      expect(await exists(task.container)).toBe(false);

      // --all through the replaced shim and SSH: the engine's listing finds what the shim does not know.
      const other = await runningTask();
      const owner = (await readFile(join(shim.home, ".taskshim-home-id"), "utf8")).trim();
      const swept = await runFence([
        "--shim",
        replaced.url,
        ...sshFlags(),
        "--all",
        "--label",
        `ai.dstack.taskshim.owner=${owner}`,
        "--json",
      ]);
      expect(swept.code).toBe(0);
      const sweptReport = JSON.parse(swept.stdout) as FenceReport;
      expect(sweptReport).toMatchObject({ via: "ssh", confirmed: true, error: null });
      expect(sweptReport.results).toEqual([
        expect.objectContaining({
          container: other.container,
          task_id: other.id,
          outcome: "removed",
          via: "ssh",
        }),
      ]);
      expect(await exists(other.container)).toBe(false);
    } finally {
      await replaced.stop();
      await rm(replaced.home, { recursive: true, force: true });
    }
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
        "5s",
        "--json",
      ]);
      expect(fenced.code, fenced.stdout + fenced.stderr).toBe(0);
      // The shim had its whole deadline to answer first.
      expect(fenced.ms).toBeGreaterThanOrEqual(5_000);
      const report = JSON.parse(fenced.stdout) as FenceReport;
      expect(report).toEqual({
        host: `root@127.0.0.1:${sshPort}`,
        via: "ssh",
        confirmed: true,
        error: null,
        results: [
          expect.objectContaining({
            container: task.container,
            task_id: task.id,
            outcome: "removed",
            reason: null,
            via: "ssh",
          }),
        ],
      });
      expect(await exists(task.container)).toBe(false);
    } finally {
      shim.child.kill("SIGCONT");
    }
  });
});
