import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { pollUntil, ServiceRunner } from "./support/service-runner.js";
import { freePort, ShimApi, tempHome, type TaskInfo } from "./support/shim-process.js";

/*
 * A stock dstack server's two ways of putting its shim on a host, replayed on this machine with
 * taskshim as the shim (the steps and texts of dstack's `ssh_deploy._deploy_instance`,
 * `provisioning.py` and `compute.get_shim_commands`, as docs/operations.md's "Running under a
 * dstack server" lists them, under a temp root instead of /): the SSH-fleet deploy (download, shim.env, rm host_info.json,
 * the systemd unit with a bare ExecStart, `systemctl restart`, wait for host_info.json, then the
 * healthcheck) run by a small stand-in for systemd (test/support/service-runner.ts; these
 * machines have no systemd), a re-deploy with a task running, then the cloud-init launch loop on
 * the same home. The shim is the single binary (scripts/build-binary.mjs), as dstack downloads it.
 */

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");
/** What systemd gives a `User=root` service (and PATH without the project's pinned node). */
const SERVICE_BASE_ENV = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: "/root",
  USER: "root",
  LOGNAME: "root",
  SHELL: "/bin/sh",
  ...(process.env.DOCKER_HOST ? { DOCKER_HOST: process.env.DOCKER_HOST } : {}),
};

let images: TestImages;
let root: string;
let downloads: Server;
let downloadBase: string;
let binaryBytes: Buffer;
let port: number;
let shim: ShimApi;
let unit: ServiceRunner | undefined;
let cloudLoop: ChildProcess | undefined;
const paths = {
  binary: "",
  home: "",
  unit: "",
  runner: "",
};

/** The server's variables (compute.get_shim_env), as upload_envs writes them for SSH fleets. */
function shimEnv(): Record<string, string> {
  return {
    DSTACK_SHIM_HOME: paths.home,
    DSTACK_SHIM_HTTP_PORT: String(port),
    DSTACK_SHIM_LOG_LEVEL: "5",
    DSTACK_RUNNER_DOWNLOAD_URL: `${downloadBase}/0.21.3/binaries/dstack-runner-linux-amd64`,
    DSTACK_RUNNER_BINARY_PATH: paths.runner,
    DSTACK_RUNNER_HTTP_PORT: "10999",
    DSTACK_RUNNER_SSH_PORT: "10022",
    DSTACK_RUNNER_LOG_LEVEL: "5",
  };
}

/** ssh_deploy._deploy_instance, from the download to `systemctl restart` (steps 2–5). */
async function sshFleetDeploy(): Promise<void> {
  const url = `${downloadBase}/0.21.3/taskshim-linux-amd64`;
  // get_shim_pre_start_commands, joined by && and run by `sh -c` as the server does.
  await exec("sh", [
    "-c",
    [
      `dlpath=$(mktemp -t dstack-shim.XXXXXXXXXX)`,
      `curl -sS --compressed --connect-timeout 60 --max-time 240 --retry 1 --output "$dlpath" "${url}"`,
      `mv "$dlpath" ${paths.binary}`,
      `chmod +x ${paths.binary}`,
      `mkdir ${paths.home} -p`,
    ].join(" && "),
  ]);
  // upload_envs: KEY="value" lines, DSTACK_SERVICE_MODE="1" added.
  const env = { ...shimEnv(), DSTACK_SERVICE_MODE: "1" };
  await writeFile(
    join(paths.home, "shim.env"),
    Object.entries(env)
      .map(([key, value]) => `${key}="${value}"`)
      .join("\n"),
  );
  await rm(join(paths.home, "host_info.json"), { force: true });
  await rm(paths.runner, { force: true });
  // run_shim_as_systemd_service's unit, then daemon-reload, enable, restart.
  await writeFile(
    paths.unit,
    [
      "[Unit]",
      "Description=dstack-shim",
      "After=network-online.target",
      "StartLimitIntervalSec=3600",
      "StartLimitBurst=1080",
      "",
      "[Service]",
      "Type=simple",
      "User=root",
      "Restart=always",
      "RestartSec=3",
      `WorkingDirectory=${paths.home}`,
      `EnvironmentFile=${paths.home}/shim.env`,
      `ExecStart=${paths.binary}`,
      "",
      "[Install]",
      "WantedBy=multi-user.target",
      "",
    ].join("\n"),
  );
  unit ??= new ServiceRunner(paths.unit, SERVICE_BASE_ENV);
  await unit.restart();
}

/** get_host_info: `cat host_info.json` until it exists (every 100 ms here, 3 s there), parsed. */
async function hostInfo(): Promise<Record<string, unknown>> {
  return pollUntil(
    async () =>
      JSON.parse(await readFile(join(paths.home, "host_info.json"), "utf8")) as Record<string, unknown>,
    60_000,
  ).catch((error: unknown) => {
    throw new Error(`no host_info.json: ${String(error)}\n${unit?.output ?? ""}`);
  });
}

/** `ip -o addr`'s non-loopback addresses: all of them, and those of links other than containers' veths. */
async function hostAddresses(): Promise<{ all: string[]; stable: string[] }> {
  const { stdout } = await exec("ip", ["-o", "addr", "show"]);
  const rows = [...stdout.matchAll(/^\d+: (\S+)\s+inet6? (\S+)/gm)]
    .map((m) => ({ link: m[1] ?? "", address: m[2] ?? "" }))
    .filter((r) => !r.address.startsWith("127.") && r.address !== "::1/128");
  return {
    all: rows.map((r) => r.address),
    stable: rows.filter((r) => !r.link.startsWith("veth")).map((r) => r.address),
  };
}

function task(id: string, command: string[]) {
  return { id, name: id, image_name: images.busybox, command };
}

async function startedAt(containerId: string): Promise<string> {
  return (await testDocker().getContainer(containerId).inspect()).State.StartedAt;
}

beforeAll(async () => {
  images = await ensureTestImages();
  root = await tempHome("taskshim-deploy-");
  paths.binary = join(root, "usr/local/bin/dstack-shim");
  paths.runner = join(root, "usr/local/bin/dstack-runner");
  paths.home = join(root, "root/.dstack");
  paths.unit = join(root, "etc/systemd/system/dstack-shim.service");
  await Promise.all([
    mkdir(join(root, "usr/local/bin"), { recursive: true }),
    mkdir(join(root, "etc/systemd/system"), { recursive: true }),
  ]);
  const built = join(root, "build/taskshim-linux-amd64");
  await exec(process.execPath, [join(ROOT, "scripts/build-binary.mjs"), "--outfile", built], { cwd: ROOT });
  binaryBytes = await readFile(built);
  // The release's download server: the taskshim binary, and a stand-in dstack-runner.
  const runnerScript = '#!/bin/sh\necho "dstack-runner version 0.21.3"\n';
  downloads = createServer((request, response) => {
    if (request.url?.endsWith("/taskshim-linux-amd64")) response.end(binaryBytes);
    else if (request.url?.endsWith("/dstack-runner-linux-amd64")) response.end(runnerScript);
    else response.writeHead(404).end();
  });
  await new Promise<void>((done) => downloads.listen(0, "127.0.0.1", done));
  const address = downloads.address();
  downloadBase = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  port = await freePort();
  shim = new ShimApi(`http://127.0.0.1:${port}`, () => `${unit?.output ?? ""}`);
}, 180_000);

afterAll(async () => {
  if (cloudLoop?.pid !== undefined) process.kill(-cloudLoop.pid, "SIGKILL");
  await unit?.stop();
  const docker = testDocker();
  for (const c of await docker.listContainers({
    all: true,
    filters: { label: ["ai.dstack.shim.is-task=true"] },
  })) {
    const id = c.Labels["ai.dstack.shim.task-id"] ?? "";
    if (id.startsWith("dstack-deploy-")) await docker.getContainer(c.Id).remove({ force: true });
  }
  await new Promise<void>((done) => downloads.close(() => done()));
  await rm(root, { recursive: true, force: true });
});

describe("deployed by a stock dstack server", () => {
  const running = `dstack-deploy-running-${process.pid}`;
  const exiting = `dstack-deploy-exiting-${process.pid}`;
  let runningContainer = "";
  let runningSince = "";

  it("SSH fleet: the unit's bare ExecStart serves, host_info.json is the host's, then the healthcheck answers", async () => {
    await sshFleetDeploy();
    const info = await hostInfo();
    // The server asks the healthcheck right after reading the file: it must answer at once.
    const health = await shim.request<{ service: string; version: string }>("GET", "/api/healthcheck");
    expect(health.status).toBe(200);
    expect(health.json.service).toBe("dstack-shim");

    const docker = testDocker();
    const engineRoot = (await docker.info()) as { DockerRootDir: string };
    const [nproc, meminfo, statfs, ipAddr] = await Promise.all([
      exec("nproc"),
      readFile("/proc/meminfo", "utf8"),
      exec("stat", ["-f", "-c", "%a %S", engineRoot.DockerRootDir]),
      hostAddresses(),
    ]);
    const [bavail = 0, bsize = 0] = statfs.stdout.trim().split(" ").map(Number);
    const memTotalKiB = Number(/^MemTotal:\s+(\d+) kB$/m.exec(meminfo)?.[1]);

    expect(Object.keys(info).sort()).toEqual(
      [
        "addresses",
        "cpus",
        "disk_size",
        "gpu_count",
        "gpu_memory",
        "gpu_name",
        "gpu_vendor",
        "memory",
      ].sort(),
    );
    expect(info).toMatchObject({ gpu_vendor: "none", gpu_name: "", gpu_memory: 0, gpu_count: 0 });
    expect(info.cpus).toBe(Number(nproc.stdout.trim()));
    expect(info.memory).toBe(memTotalKiB * 1024);
    // Other tests' containers come and go (their veth links): every other address, and nothing
    // the host did not have around the read.
    const addresses = info.addresses as string[];
    expect(addresses).toEqual(expect.arrayContaining(ipAddr.stable));
    const after = await hostAddresses();
    for (const a of addresses) expect([...ipAddr.all, ...after.all]).toContain(a);
    // Other tests write to this disk meanwhile: within 256 MiB of statvfs now.
    expect(Math.abs((info.disk_size as number) - bavail * bsize)).toBeLessThan(256 * 2 ** 20);
    // dstack's host_info_to_instance_type: memory and disk in MiB, > 0.
    expect(Math.floor((info.memory as number) / 2 ** 20)).toBeGreaterThan(0);
    expect(Math.floor((info.disk_size as number) / 2 ** 20)).toBeGreaterThan(0);
    expect(unit?.runs).toHaveLength(1);
  });

  it("SSH fleet re-deploy (systemctl restart) with tasks running: nothing restarted, nothing lost", async () => {
    await shim.submit(task(running, ["sh", "-c", "echo up; sleep 3600"]));
    await shim.submit(task(exiting, ["sh", "-c", "sleep 3600"]));
    const before = await shim.waitTask(running, (t) => t.status === "running", 60_000);
    await shim.waitTask(exiting, (t) => t.status === "running", 60_000);
    runningContainer = before.container_id;
    runningSince = await startedAt(runningContainer);
    const infoBefore = await readFile(join(paths.home, "host_info.json"), "utf8");

    await sshFleetDeploy();
    // Written again (the server removed it), the same host: only the free disk space and the
    // addresses of other tests' containers move.
    const {
      disk_size: _before,
      addresses: _was,
      ...sameBefore
    } = JSON.parse(infoBefore) as Record<string, unknown>;
    const { disk_size: _after, addresses: _is, ...sameAfter } = await hostInfo();
    expect(sameAfter).toEqual(sameBefore);
    const after = await shim.task(running);
    expect(after).toMatchObject({ status: "running", container_id: runningContainer });
    expect(await startedAt(runningContainer)).toBe(runningSince);
    expect(unit?.runs.map((r) => r.exit)).toEqual([0, undefined]);
  });

  it("a re-deploy from the unit to the cloud-init loop (same home) keeps the tasks; an exit while down is final", async () => {
    await unit?.stop();
    // The task exits while no shim runs: finalized by the next one with its real exit code.
    await expect(shim.request("GET", "/api/healthcheck")).rejects.toThrow();
    const docker = testDocker();
    const exitingContainer = (
      await docker.listContainers({ filters: { label: [`ai.dstack.shim.task-id=${exiting}`] } })
    )[0];
    await docker.getContainer(exitingContainer?.Id ?? "").kill();

    // compute.get_shim_commands: exported variables (no service mode), then the launch loop.
    const exports = Object.entries(shimEnv())
      .map(([key, value]) => `export "${key}=${value}"`)
      .join(" && ");
    const loop = `while true; do ${paths.binary} --privileged --pjrt-device=TPU; sleep 3; done`;
    cloudLoop = spawn("sh", ["-c", `${exports} && nohup sh -c '${loop}'`], {
      env: SERVICE_BASE_ENV,
      cwd: "/",
      detached: true,
      stdio: "ignore",
    });
    await pollUntil(async () => {
      const answer = await shim.request("GET", "/api/healthcheck");
      if (answer.status !== 200) throw new Error(`healthcheck ${answer.status}`);
    }, 60_000);
    expect(await shim.task(running)).toMatchObject({ status: "running", container_id: runningContainer });
    expect(await startedAt(runningContainer)).toBe(runningSince);
    const exited = await shim.waitTerminated(exiting);
    expect(exited).toMatchObject({ termination_reason: "container_exited_with_error" });
    expect((exited as TaskInfo & { exit_code: number }).exit_code).toBe(137);

    // The loop's flags reach every container: privileged, with PJRT_DEVICE. (A privileged container
    // cannot start in this sandbox, where runc may not apply every capability: the container the
    // shim created is inspected, as test/lifecycle.test.ts does.)
    const tpu = `dstack-deploy-tpu-${process.pid}`;
    await shim.submit(task(tpu, ["sh", "-c", "sleep 3600"]));
    const tpuInfo = await shim.waitTask(tpu, (t) => t.container_id !== "", 60_000);
    const inspected = await docker.getContainer(tpuInfo.container_id).inspect();
    expect(inspected.HostConfig.Privileged).toBe(true);
    expect(inspected.Config.Env).toContain("PJRT_DEVICE=TPU");
  });

  it("the cloud-init loop restarts a killed shim, which adopts the running task as it was", async () => {
    // The loop's shim by its flags (its component check also runs `dstack-shim --version`).
    const pids = (await exec("pgrep", ["-f", `^${paths.binary} --privileged`])).stdout
      .trim()
      .split("\n")
      .map(Number);
    expect(pids).toHaveLength(1);
    process.kill(pids[0] ?? 0, "SIGKILL");
    await pollUntil(async () => {
      const again = (await exec("pgrep", ["-f", `^${paths.binary} --privileged`])).stdout.trim();
      if (again === "" || Number(again) === pids[0]) throw new Error("not restarted yet");
      const answer = await shim.request("GET", "/api/healthcheck");
      if (answer.status !== 200) throw new Error(`healthcheck ${answer.status}`);
    }, 30_000);
    expect(await shim.task(running)).toMatchObject({ status: "running", container_id: runningContainer });
    expect(await startedAt(runningContainer)).toBe(runningSince);
    // The home's binary is the one dstack downloaded: its bytes, not a copy of ours elsewhere.
    expect(
      createHash("sha256")
        .update(await readFile(paths.binary))
        .digest("hex"),
    ).toBe(createHash("sha256").update(binaryBytes).digest("hex"));
  });
});
