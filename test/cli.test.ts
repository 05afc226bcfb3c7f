import { spawn, spawnSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pkg from "../package.json" with { type: "json" };
import { formatBytes } from "../src/cli/sizes.js";
import { shellQuote } from "../src/docker/container-spec.js";
import { removeImagesOf, testDocker } from "./support/docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import { startSlowProxy } from "./support/slow-proxy.js";
import { freePort, SHIM_BUNDLE, ShimProcess, type TaskInfo } from "./support/shim-process.js";

/*
 * Every client command of `taskshim`, run as a child process (`node dist/taskshim.cjs …`)
 * against a real shim on the real engine. Other shims may share the engine, so the tests only
 * ever look at, terminate and remove the tasks they submitted themselves.
 */

let shim: ShimProcess;
let images: TestImages;
let workDir: string;
let seq = 0;
/** Tasks submitted here, cleaned up at the end whatever the tests did. */
const submitted = new Set<string>();

interface CliResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `taskshim ARGS` to its end (stdin closed unless `input` is given). */
function cli(
  args: readonly string[],
  options: { input?: string; timeoutMs?: number } = {},
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    for (const name of ["TASKSHIM_URL", "TASKSHIM_AUTH_TOKEN_FILE", "TASKSHIM_REGISTRY_PASSWORD"])
      delete env[name];
    const child = spawn(process.execPath, [SHIM_BUNDLE, ...args], { env, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(
        new Error(
          `taskshim ${args.join(" ")} did not end within ${options.timeoutMs ?? 60_000} ms:\n${stdout}\n${stderr}`,
        ),
      );
    }, options.timeoutMs ?? 60_000);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    child.stdin.end(options.input ?? "");
  });
}

/** `taskshim ARGS --shim <the test shim>` (the flag goes before a `--`, which ends the options). */
function client(
  args: readonly string[],
  options?: { input?: string; timeoutMs?: number },
): Promise<CliResult> {
  const end = args.indexOf("--");
  const withShim =
    end === -1
      ? [...args, "--shim", shim.url]
      : [...args.slice(0, end), "--shim", shim.url, ...args.slice(end)];
  return cli(withShim, options);
}

/** A fresh task id and `tst-cli-` name; the id is cleaned up after the run. */
function newTask(label: string): { id: string; name: string } {
  seq += 1;
  const id = `cli-${label}-${process.pid}-${seq}-${Date.now().toString(36)}`;
  submitted.add(id);
  return { id, name: `tst-cli-${label}-${seq}` };
}

/** One clear line on stderr: `taskshim: …`, no stack trace. */
function expectOneErrorLine(result: CliResult, pattern: RegExp): void {
  expect(result.code).toBe(1);
  expect(result.stderr).toMatch(/^taskshim: [^\n]+\n$/);
  expect(result.stderr).toMatch(pattern);
  expect(result.stderr).not.toMatch(/\n\s+at /);
}

/** Submits a long-running task through the API and waits until it runs. */
async function runningTask(label: string): Promise<TaskInfo> {
  const { id, name } = newTask(label);
  await shim.submit({ id, name, image_name: images.busybox, command: ["sleep", "300"] });
  return shim.waitTask(id, (t) => t.status === "running" || t.status === "terminated");
}

beforeAll(async () => {
  images = await ensureTestImages();
  workDir = await mkdtemp(join(tmpdir(), "taskshim-cli-"));
  shim = await ShimProcess.start();
});

afterAll(async () => {
  if (shim) {
    for (const id of submitted) {
      await shim.terminate(id).catch(() => undefined);
      await shim.remove(id).catch(() => undefined);
    }
    await shim.stop();
  }
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

describe("taskshim status", () => {
  it("shows the version, the engine, GPUs and task counts", async () => {
    const result = await client(["status"]);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(
      new RegExp(`^version: +${pkg.version.replaceAll(".", "\\.")} \\(taskshim\\)$`, "m"),
    );
    expect(result.stdout).toMatch(/^phase: +serving since \d{4}-\d\d-\d\dT/m);
    expect(result.stdout).toMatch(/^engine: +docker [\w.+~-]+, up since \d{4}-\d\d-\d\dT/m);
    expect(result.stdout).toMatch(/^gpus: +none$/m);
    expect(result.stdout).toMatch(/^components: +dstack-runner \S+, dstack-shim installed \(/m);
    expect(result.stdout).toMatch(/^tasks: +\d+/m);
    expect(result.stdout).toMatch(/^quarantined: +none$/m);
  });

  it("prints the same facts as JSON, counts matching the shim's task list", async () => {
    const task = await runningTask("status");
    const result = await client(["status", "--json"]);
    expect(result.code).toBe(0);
    const report = JSON.parse(result.stdout) as {
      version: string;
      implementation: string;
      engine: { status: string };
      gpu: { vendor: string | null; in_use: number };
      tasks: { total: number; by_status: Record<string, number> };
      quarantined_state_files: Record<string, number>;
    };
    expect(report).toMatchObject({
      version: pkg.version,
      implementation: "taskshim",
      engine: { status: "up" },
      gpu: { vendor: null, in_use: 0 },
      quarantined_state_files: { corrupt: 0, "newer-format": 0 },
    });
    const tasks = (await shim.request<{ tasks: { status: string }[] }>("GET", "/api/tasks")).json.tasks;
    expect(report.tasks.total).toBe(tasks.length);
    expect(Object.values(report.tasks.by_status).reduce((a, b) => a + b, 0)).toBe(tasks.length);
    expect(report.tasks.by_status.running).toBeGreaterThanOrEqual(task.status === "running" ? 1 : 0);
  });
});

describe("taskshim tasks: submit, ls, get, logs, terminate, rm", () => {
  it("runs a task through its whole life from the command line", async () => {
    const { id, name } = newTask("life");
    const hostDir = join(workDir, "mounted");
    await rm(hostDir, { recursive: true, force: true });
    await mkdir(hostDir, { recursive: true });
    await writeFile(join(hostDir, "file"), "from-the-host\n");

    const submit = await client([
      "tasks",
      "submit",
      "--id",
      id,
      "--name",
      name,
      "--image",
      images.busybox,
      "--env",
      "GREETING=hello",
      "--memory",
      "64MiB",
      "--shm",
      "16MiB",
      "--cpu",
      "0.5",
      "--mount",
      `${hostDir}:/data`,
      "--",
      "sh",
      "-c",
      'echo "$GREETING $(cat /data/file)"; sleep 300',
    ]);
    expect(submit.stderr).toBe("");
    expect(submit.code).toBe(0);
    const lines = submit.stdout.trim().split("\n");
    expect(lines[0]).toMatch(new RegExp(`^submitted task ${id} \\(container ${name}-[0-9a-f]{8}\\)$`));
    expect(lines.at(-1)).toMatch(new RegExp(`^running: task ${id} in container ${name}-[0-9a-f]{8}$`));

    const task = await shim.task(id);
    expect(task.status).toBe("running");
    const container = await testDocker().getContainer(task.container_id).inspect();
    expect(container.HostConfig.Memory).toBe(64 * 1024 * 1024);
    expect(container.HostConfig.ShmSize).toBe(16 * 1024 * 1024);
    expect(container.HostConfig.NanoCpus).toBe(500_000_000);
    expect(container.Config.Env).toContain("GREETING=hello");
    expect(container.Mounts).toContainEqual(
      expect.objectContaining({ Source: hostDir, Destination: "/data" }),
    );

    const ls = await client(["tasks", "ls"]);
    expect(ls.code).toBe(0);
    expect(ls.stdout.split("\n")[0]).toMatch(/^ID\s+NAME\s+IMAGE\s+STATUS\s+CREATED$/);
    expect(ls.stdout).toMatch(
      new RegExp(
        `^${id.slice(0, 12)}\\s+${name}\\s+\\S+\\s+Up (Less than a second|\\d+ seconds?)\\s+\\S.* ago$`,
        "m",
      ),
    );
    const lsJson = JSON.parse((await client(["tasks", "ls", "--json"])).stdout) as TaskInfo[];
    expect(lsJson.find((t) => t.id === id)).toMatchObject({
      status: "running",
      container_id: task.container_id,
    });

    const get = await client(["tasks", "get", id]);
    expect(get.code).toBe(0);
    expect(get.stdout).toContain(`id:         ${id}\nname:       ${name}\n`);
    expect(get.stdout).toMatch(/^status: +running \(Up .*\)\nexit code: +-\n/m);
    expect(get.stdout).toMatch(/^started: +\d{4}-\d\d-\d\dT\S+Z \(.* ago\)$/m);
    expect(get.stdout).toContain(`container:  ${task.container_name} (${task.container_id.slice(0, 12)})`);
    expect(JSON.parse((await client(["tasks", "get", id, "--json"])).stdout)).toEqual(task);

    let logs: CliResult | undefined;
    for (let i = 0; i < 50; i++) {
      logs = await client(["tasks", "logs", id, "--tail", "5"]);
      if (logs.stdout !== "") break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(logs?.code).toBe(0);
    expect(logs?.stdout).toBe("hello from-the-host\n");

    const early = await client(["tasks", "rm", id]);
    expectOneErrorLine(
      early,
      new RegExp(
        `^taskshim: request error: cannot remove task ${id} with running status \\(terminate it first: taskshim tasks terminate ${id}, or taskshim tasks rm --force ${id}\\)\\n$`,
      ),
    );

    const terminate = await client(["tasks", "terminate", id, "--timeout", "0", "--message", "enough"]);
    expect(terminate.code).toBe(0);
    expect(terminate.stdout).toMatch(
      /^status: +terminated \(Exited \(137\) .*\)\nexit code: +137\nreason: +terminated_by_user\nmessage: +enough\n/m,
    );

    const removed = await client(["tasks", "rm", id]);
    expect(removed).toEqual({ code: 0, stdout: `removed task ${id}\n`, stderr: "" });
    expectOneErrorLine(
      await client(["tasks", "get", id]),
      new RegExp(`^taskshim: no such task: ${id} \\(see taskshim tasks ls\\)\\n$`),
    );
    await expect(testDocker().getContainer(task.container_id).inspect()).rejects.toMatchObject({
      statusCode: 404,
    });
  });

  it("submits a config file, and prints only JSON with --json", async () => {
    const { id, name } = newTask("file");
    const file = join(workDir, "task.json");
    await writeFile(
      file,
      JSON.stringify({ id, name, image_name: images.busybox, command: ["sleep", "300"] }),
    );
    const result = await client(["tasks", "submit", "--file", file, "--json"]);
    expect(result.code).toBe(0);
    const final = JSON.parse(result.stdout) as TaskInfo;
    expect(final).toMatchObject({ id, status: "running", termination_reason: "" });
    // Progress went to stderr, so stdout stays parseable.
    expect(result.stderr).toContain(`submitted task ${id}`);
  });

  it("reads the config from stdin, generates an id, and returns at once with --detach", async () => {
    const result = await client(["tasks", "submit", "--file", "-", "--detach", "--json"], {
      input: JSON.stringify({ name: "tst-cli-stdin", image_name: images.busybox, command: ["sleep", "300"] }),
    });
    expect(result.code).toBe(0);
    const task = JSON.parse(result.stdout) as TaskInfo;
    submitted.add(task.id);
    expect(task.id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(task.container_name).toMatch(/^tst-cli-stdin-[0-9a-f]{8}$/);
    expect((await shim.waitTask(task.id, (t) => t.status === "running")).status).toBe("running");
  });

  it("exits 1 with the reason when the task fails to start", async () => {
    const { id, name } = newTask("fail");
    const image = `127.0.0.1:${await freePort()}/nothing/here:1`;
    const result = await client([
      "tasks",
      "submit",
      "--id",
      id,
      "--name",
      name,
      "--image",
      image,
      "--",
      "true",
    ]);
    expect(result.stdout).toMatch(/^terminated: creating_container_error\n {2}pullImage error: /m);
    expectOneErrorLine(result, new RegExp(`^taskshim: task ${id} failed: creating_container_error\\n$`));
  });

  it("ends at once, successfully, for a task that finished before it was seen running", async () => {
    const { id, name } = newTask("quick");
    const result = await client([
      "tasks",
      "submit",
      "--id",
      id,
      "--name",
      name,
      "--image",
      images.busybox,
      "--",
      "true",
    ]);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^(running: task .*|terminated: done_by_runner)$/m);
  });

  it("shows the shim's refusal of a config as one line", async () => {
    const result = await client(["tasks", "submit", "--name", "bad name!", "--image", images.busybox]);
    expectOneErrorLine(result, /^taskshim: POST \/api\/tasks: HTTP 400: invalid name: /);
  });

  it("reports an id reused with another config as a conflict", async () => {
    const task = await runningTask("conflict");
    const result = await client([
      "tasks",
      "submit",
      "--id",
      task.id,
      "--name",
      "tst-cli-other",
      "--image",
      images.busybox,
    ]);
    expectOneErrorLine(
      result,
      new RegExp(
        `^taskshim: request error: task ${task.id} is already submitted with a different config\\n$`,
      ),
    );
  });

  it("refuses a bad flag before asking the shim", async () => {
    expectOneErrorLine(
      await client(["tasks", "submit", "--image", images.busybox, "--memory", "4XB"]),
      /^taskshim: --memory: invalid size "4XB"/,
    );
    expectOneErrorLine(
      await client(["tasks", "submit", "--image", images.busybox, "--mount", "data:/data"]),
      /^taskshim: --mount: /,
    );
    expectOneErrorLine(await client(["tasks", "submit", "--name", "tst-cli-x"]), /^taskshim: no image: /);
    expectOneErrorLine(
      await client(["tasks", "logs", "x", "--tail", "0"]),
      /^taskshim: --tail: expected an integer from 1 to 10000/,
    );
  });

  it("removes a running task with rm --force", async () => {
    const task = await runningTask("force");
    const result = await client(["tasks", "rm", task.id, "--force"]);
    expect(result).toEqual({ code: 0, stdout: `removed task ${task.id}\n`, stderr: "" });
    expect((await shim.request("GET", `/api/tasks/${task.id}`)).status).toBe(404);
  });

  it("reports an unknown task as one line naming it, whatever the command", async () => {
    for (const command of ["get", "terminate", "logs", "rm", "wait"]) {
      expectOneErrorLine(
        await client(["tasks", command, "no-such-task"]),
        /^taskshim: no such task: no-such-task \(see taskshim tasks ls\)\n$/,
      );
    }
  });
});

describe("taskshim tasks: ids, names, exit codes, waiting", () => {
  it("finds a task by its name or a unique id prefix, and lists the candidates of an ambiguous one", async () => {
    seq += 1;
    const stem = `pfx${process.pid}x${seq}${Date.now().toString(36)}`;
    const ids = [`${stem}-a1`, `${stem}-b2`];
    const names = [`tst-cli-pfx-a-${seq}`, `tst-cli-pfx-b-${seq}`];
    for (const [i, id] of ids.entries()) {
      submitted.add(id);
      await shim.submit({ id, name: names[i], image_name: images.busybox, command: ["sleep", "300"] });
    }
    const byName = await client(["tasks", "get", names[1]!, "--json"]);
    expect(byName.code).toBe(0);
    expect((JSON.parse(byName.stdout) as TaskInfo).id).toBe(ids[1]);
    const byPrefix = await client(["tasks", "get", `${stem}-a`, "--json"]);
    expect((JSON.parse(byPrefix.stdout) as TaskInfo).id).toBe(ids[0]);
    expectOneErrorLine(
      await client(["tasks", "terminate", stem]),
      new RegExp(
        `^taskshim: id prefix ${stem} matches 2 tasks: ${ids[0]} \\(${names[0]}\\), ${ids[1]} \\(${names[1]}\\); give more of the id\\n$`,
      ),
    );
    // rm by name, after terminate by prefix.
    expect((await client(["tasks", "terminate", `${stem}-b`, "--timeout", "0"])).code).toBe(0);
    expect(await client(["tasks", "rm", names[1]!])).toEqual({
      code: 0,
      stdout: `removed task ${ids[1]}\n`,
      stderr: "",
    });
  });

  it("waits for a task and exits with its exit code; ls shows it as docker does, newest first", async () => {
    const { id, name } = newTask("wait");
    await shim.submit({ id, name, image_name: images.busybox, command: ["sh", "-c", "sleep 2; exit 3"] });
    const began = Date.now();
    const wait = await client(["tasks", "wait", name]);
    expect(wait).toEqual({ code: 3, stdout: "3\n", stderr: "" });
    expect(Date.now() - began).toBeGreaterThan(1_000);
    const info = await shim.task(id);
    expect(info).toMatchObject({ status: "terminated", exit_code: 3 });
    const later = newTask("wait-later");
    await shim.submit({ ...later, image_name: images.busybox, command: ["sleep", "300"] });
    const ls = await client(["tasks", "ls", "--filter", `name=${name}`, "--filter", "status=terminated"]);
    expect(ls.stdout).toMatch(
      new RegExp(`^${id.slice(0, 12)}\\s+${name}\\s+\\S+\\s+Exited \\(3\\) .* ago\\s+.* ago$`, "m"),
    );
    const quiet = (await client(["tasks", "ls", "-q"])).stdout.split("\n");
    expect(quiet.indexOf(later.id)).toBeLessThan(quiet.indexOf(id));
    expect(quiet.indexOf(later.id)).toBeGreaterThanOrEqual(0);
    const get = await client(["tasks", "get", id]);
    expect(get.stdout).toMatch(/^exit code: +3$/m);
    expect(get.stdout).toMatch(/^finished: +\d{4}-\S+Z \(.* ago\)$/m);
  });

  it("waits out the whole grace of the default terminate for a container that ignores SIGTERM", async () => {
    const { id, name } = newTask("stubborn");
    await shim.submit({
      id,
      name,
      image_name: images.busybox,
      command: ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
    });
    await shim.waitTask(id, (t) => t.status === "running");
    const began = Date.now();
    const result = await client(["tasks", "terminate", id], { timeoutMs: 40_000 });
    const took = Date.now() - began;
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^status: +terminated \(Exited \(137\)/m);
    // The default grace is 10 s: the client waited for it instead of giving up at 9 s.
    expect(took).toBeGreaterThan(9_500);
    expect((await shim.task(id)).status).toBe("terminated");
  });

  it("refuses logs of a task without a container, an unknown reason, and a size in two words", async () => {
    const { id, name } = newTask("nolog");
    const image = `127.0.0.1:${await freePort()}/nothing/here:1`;
    await shim.submit({ id, name, image_name: image, command: ["true"] });
    await shim.waitTerminated(id);
    expectOneErrorLine(
      await client(["tasks", "logs", id]),
      new RegExp(
        `^taskshim: task ${id} has no container \\(terminated: creating_container_error\\), so no output; see taskshim tasks get ${id}\\n$`,
      ),
    );
    expectOneErrorLine(
      await client(["tasks", "terminate", id, "--reason", "foo"]),
      /^taskshim: --reason: unknown reason "foo"; one of: executor_error, .*terminated_by_user, .*volume_error\n$/,
    );
    expectOneErrorLine(
      await client(["tasks", "submit", "--image", images.busybox, "--memory", "4", "GB"]),
      /^taskshim: --memory: give a unit, like 4GiB or 4MiB/,
    );
    const unknown = await client(["tasks", "ls", "--bogus"]);
    expectOneErrorLine(unknown, /^taskshim: unknown option '--bogus' \(see taskshim tasks ls --help\)\n$/);
    expect(unknown.stdout).toBe("");
  });

  it("runs the container as --user", async () => {
    const { id, name } = newTask("user");
    const result = await client([
      "tasks",
      "submit",
      "--id",
      id,
      "--name",
      name,
      "--image",
      images.busybox,
      "--user",
      "1234:5678",
      "--",
      "sleep",
      "300",
    ]);
    expect(result.code).toBe(0);
    const container = await testDocker()
      .getContainer((await shim.task(id)).container_id)
      .inspect();
    expect(container.Config.User).toBe("1234:5678");
  });

  it("ends quietly with status 0 when its reader goes away (| head -1)", async () => {
    const { id, name } = newTask("pipe");
    const began = Date.now();
    const piped = spawn(
      "bash",
      [
        "-c",
        `"${process.execPath}" "${SHIM_BUNDLE}" tasks watch --timeout 30s --shim ${shim.url} | head -1; echo "status=\${PIPESTATUS[0]}" >&2`,
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    let stderr = "";
    piped.stdout.on("data", (c: Buffer) => (stdout += c.toString()));
    piped.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    // Listened for at once: with tasks already on the shim, the first snapshot alone outlasts
    // head, and the watch may be gone before anything below runs.
    const closed = new Promise<void>((resolve) => piped.once("close", () => resolve()));
    // Changes after head has gone: the watch's next write meets the closed pipe. (The submit's
    // own burst of changes may all be written before head has read its line, so a terminate
    // follows once the task runs.)
    await new Promise((r) => setTimeout(r, 1_500));
    await shim.submit({ id, name, image_name: images.busybox, command: ["sleep", "300"] });
    await shim.waitTask(id, (t) => t.status === "running");
    await shim.request("POST", `/api/tasks/${id}/terminate`, {
      termination_reason: "terminated_by_user",
      timeout: 0,
    });
    await closed;
    expect(stdout.split("\n").filter(Boolean)).toHaveLength(1);
    expect(stderr).toBe("status=0\n");
    expect(Date.now() - began).toBeLessThan(20_000);
  });
});

describe("taskshim tasks submit: pull progress from a registry", () => {
  let registry: LocalRegistry;

  /** A fresh single-layer image in the registry and not in the engine, so the pull downloads. */
  async function pushedImage(repo: string): Promise<string> {
    const local = await createUniqueImage();
    const ref = await registry.push(local, repo, "v1");
    await testDocker().getImage(local).remove({ force: true });
    return ref;
  }

  beforeAll(async () => {
    registry = await startRegistry({ username: "cli-user", password: "cli-pass-1234" });
  });
  afterAll(async () => {
    await registry?.stop();
  });

  /** `tasks submit` flags of a `sleep 300` task whose image is pulled from the private registry. */
  const privateSleepTask = (id: string, name: string, image: string): string[] => [
    "--id",
    id,
    "--name",
    name,
    "--image",
    image,
    "--registry-user",
    registry.username,
    "--registry-password",
    registry.password,
    "--",
    "sleep",
    "300",
  ];

  it("prints plain progress lines when stdout is not a terminal", async () => {
    const { id, name } = newTask("pull");
    const image = await pushedImage("cli/plain");
    const result = await client(["tasks", "submit", ...privateSleepTask(id, name, image)]);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    const task = await shim.task(id);
    const total = task.image_pull_progress?.total_bytes ?? 0;
    expect(total).toBeGreaterThan(0);
    expect(result.stdout).not.toContain("\r");
    const lines = result.stdout.trim().split("\n");
    const pulled = lines.findIndex((l) => /^pulled \d+(\.\d)? (B|kB|MB)$/.test(l));
    expect(pulled, result.stdout).toBeGreaterThan(0);
    expect(lines[pulled]).toBe(`pulled ${formatBytes(total)}`);
    for (const line of lines.slice(1, pulled)) {
      expect(line).toMatch(
        /^(preparing|pulling \(waiting for layer sizes\)|(pulling|extracting) [\d.]+ k?M?B \/ [\d.]+ k?M?B\+?)$/,
      );
    }
    expect(lines.at(-1)).toMatch(new RegExp(`^running: task ${id} `));
    // The password is a flag value, never echoed.
    expect(result.stdout).not.toContain(registry.password);
  });

  const hasScript = spawnSync("script", ["--version"]).status === 0;

  /** Runs argv under util-linux `script`: a pseudo-terminal, so process.stdout.isTTY is true. */
  function underTerminal(argv: readonly string[]): Promise<CliResult> {
    const command = argv.map(shellQuote).join(" ");
    return new Promise<CliResult>((resolve, reject) => {
      const child = spawn("script", ["-qfec", command, "/dev/null"], { stdio: ["pipe", "pipe", "pipe"] });
      let stdout = "";
      child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
      child.once("error", reject);
      child.once("close", (code) => resolve({ code, stdout, stderr: "" }));
      child.stdin.end();
    });
  }

  /** `taskshim tasks submit --shim <shim> …args` under a pseudo-terminal. */
  const submitUnderTerminal = (args: readonly string[]): Promise<CliResult> =>
    underTerminal([process.execPath, SHIM_BUNDLE, "tasks", "submit", "--shim", shim.url, ...args]);

  /** The bar redraws of a terminal transcript: the text between clears that holds a percentage. */
  const barFrames = (transcript: string): string[] =>
    transcript
      .split("\r\x1b[K")
      .map((f) => f.split(/\r?\n/)[0] ?? "")
      .filter((f) => /^(\[[#-]+\] )? *\d+% /.test(f));
  it.skipIf(!hasScript)("draws a progress bar on a terminal", async () => {
    const { id, name } = newTask("tty");
    const image = await pushedImage("cli/tty");
    const result = await submitUnderTerminal(privateSleepTask(id, name, image));
    expect(result.code, result.stdout).toBe(0);
    expect(result.stdout).toContain("\r\x1b[K");
    expect(result.stdout).toMatch(/\[[#-]+\] +\d+% (pulling|extracting) /);
    expect(result.stdout).toMatch(new RegExp(String.raw`\r\x1b\[Kpulled [\d.]+ (kB|MB)\r?\n`));
    expect(result.stdout).toMatch(new RegExp(`running: task ${id} `));
    // Every redraw of the bar has the same width.
    const bars = barFrames(result.stdout);
    expect(bars.length).toBeGreaterThan(0);
    expect(new Set(bars.map((f) => f.length)).size).toBe(1);
  });

  it.skipIf(!hasScript)("clears the bar of a failed pull from the terminal", async () => {
    const { id, name } = newTask("tty-fail");
    const image = await pushedImage("cli/tty-fail");
    // The layer arrives slowly (the bar is drawn) and corrupted: the pull fails its digest check.
    const proxy = await startSlowProxy(registry.host, 256 * 1024, { corruptBlobsOver: 64 * 1024 });
    try {
      const result = await submitUnderTerminal(
        privateSleepTask(id, name, image.replace(registry.host, proxy.host)),
      );
      expect(result.code, result.stdout).toBe(1);
      expect(result.stdout).toMatch(/terminated: creating_container_error/);
      // The bar drawn while the pull ran is cleared (\r ESC[K) before the next line is written:
      // what follows the last bar frame starts with the clear, not with a newline.
      expect(barFrames(result.stdout).length, result.stdout).toBeGreaterThan(0);
      const lastBar = result.stdout.lastIndexOf("%");
      const after = result.stdout.slice(lastBar);
      expect(after.indexOf("\r\x1b[K")).toBeGreaterThanOrEqual(0);
      expect(after.slice(0, after.indexOf("\r\x1b[K"))).not.toContain("\n");
    } finally {
      await proxy.close();
      await removeImagesOf(proxy.host);
    }
  });
});

describe("taskshim tasks watch", () => {
  it("prints the tasks present and exits with --once", async () => {
    const task = await runningTask("once");
    const result = await client(["tasks", "watch", "--once"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(new RegExp(`^\\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z  ${task.id}  running$`, "m"));
  });

  it("prints each status change until its timeout, and stops on Ctrl-C", async () => {
    const anchor = await runningTask("anchor");
    const { id, name } = newTask("watch");
    const watcher = spawn(
      process.execPath,
      [SHIM_BUNDLE, "tasks", "watch", "--json", "--interval", "50ms", "--timeout", "20s", "--shim", shim.url],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stdout = "";
    let stderr = "";
    watcher.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
    watcher.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
    const exited = new Promise<number | null>((resolve) => watcher.once("close", (code) => resolve(code)));
    // The first snapshot (which holds the anchor task) is out before the new task exists.
    const deadline = Date.now() + 20_000;
    while (!stdout.includes(anchor.id) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(stdout).toContain(anchor.id);

    await shim.submit({ id, name, image_name: images.busybox, command: ["sh", "-c", "sleep 1"] });
    await shim.waitTerminated(id);
    await new Promise((r) => setTimeout(r, 300));
    expect((await shim.remove(id)).status).toBe(200);
    expect(await exited).toBe(0);
    expect(stderr).toBe("");
    const events = stdout
      .trim()
      .split("\n")
      .map(
        (l) =>
          JSON.parse(l) as {
            kind: string;
            id: string;
            from: string | null;
            to: string | null;
            termination_reason?: string;
          },
      );
    expect(events[0]).toMatchObject({ kind: "present", from: null });
    const mine = events.filter((e) => e.id === id);
    expect(mine[0]).toMatchObject({ kind: "added", from: null });
    expect(mine).toContainEqual(expect.objectContaining({ kind: "changed", to: "running" }));
    expect(mine).toContainEqual(
      expect.objectContaining({
        kind: "changed",
        from: "running",
        to: "terminated",
        termination_reason: "done_by_runner",
      }),
    );
    expect(mine.at(-1)).toMatchObject({ kind: "removed", from: "terminated", to: null });
    // The event stream reports every status, however short (a 1 s poll used to skip some).
    expect(mine.map((e) => e.to)).toEqual([
      "pending",
      "preparing",
      "pulling",
      "creating",
      "running",
      "terminated",
      null,
    ]);
    // Each event of the task follows the one before it.
    for (let i = 1; i < mine.length; i++) expect(mine[i]?.from).toBe(mine[i - 1]?.to);

    const plain = spawn(process.execPath, [SHIM_BUNDLE, "tasks", "watch", "--shim", shim.url], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let plainOut = "";
    plain.stdout.on("data", (chunk: Buffer) => (plainOut += chunk.toString("utf8")));
    const stopped = new Promise<NodeJS.Signals | null>((resolve) =>
      plain.once("close", (_code, signal) => resolve(signal)),
    );
    while (!plainOut.includes(anchor.id) && Date.now() < deadline + 10_000)
      await new Promise((r) => setTimeout(r, 20));
    expect(plainOut).toMatch(new RegExp(`^\\S+Z  ${anchor.id}  running$`, "m"));
    plain.kill("SIGINT");
    expect(await stopped).toBe("SIGINT");
  });
});

describe("errors reaching the shim", () => {
  it("says so in one line, status 1, when the peer resets or closes the connection", async () => {
    for (const mode of ["reset", "close"] as const) {
      const peer = createNetServer((socket) => {
        socket.once("data", () => (mode === "reset" ? socket.resetAndDestroy() : socket.end()));
      });
      await new Promise<void>((resolve) => peer.listen(0, "127.0.0.1", resolve));
      const url = `http://127.0.0.1:${(peer.address() as AddressInfo).port}`;
      try {
        for (const args of [["status"], ["status", "--json"], ["tasks", "ls"]]) {
          expectOneErrorLine(
            await cli([...args, "--shim", url]),
            new RegExp(`^taskshim: cannot reach the shim at ${url}: `),
          );
        }
      } finally {
        peer.close();
      }
    }
  });

  it("says so in one line when nothing listens", async () => {
    const url = `http://127.0.0.1:${await freePort()}`;
    for (const args of [
      ["status"],
      ["tasks", "ls"],
      ["tasks", "get", "x"],
      ["tasks", "watch"],
      ["tasks", "logs", "x"],
    ]) {
      const result = await cli([...args, "--shim", url]);
      expectOneErrorLine(
        result,
        new RegExp(`^taskshim: cannot reach the shim at ${url}: connect ECONNREFUSED`),
      );
      expect(result.stdout).toBe("");
    }
  });

  it("refuses an answer that breaks the contract", async () => {
    const server: Server = createServer((_request, response) => {
      response.writeHead(200, { "content-type": "application/json" }).end('{"tasks":"not a list"}');
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      expectOneErrorLine(
        await cli(["tasks", "ls", "--shim", url]),
        new RegExp(`^taskshim: unexpected answer from the shim at ${url}: /api/tasks: unexpected response`),
      );
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it("sends the bearer token of --auth-token-file to a shim that requires one", async () => {
    const tokenFile = join(workDir, "token");
    await writeFile(tokenFile, "cli-test-token-0123456789abcdef\n", { mode: 0o600 });
    const guarded = await ShimProcess.start({ args: ["--auth-token-file", tokenFile] });
    try {
      expectOneErrorLine(
        await cli(["tasks", "ls", "--shim", guarded.url]),
        /^taskshim: GET \/api\/tasks: HTTP 401: unauthorized \(this shim needs a token: --auth-token-file FILE\)\n$/,
      );
      const ls = await cli(["tasks", "ls", "--shim", guarded.url, "--auth-token-file", tokenFile]);
      expect(ls.stderr).toBe("");
      expect(ls.code).toBe(0);
      expect(ls.stdout).toMatch(/^ID\s+NAME\s+IMAGE\s+STATUS/);
      const status = await cli(["status", "--json", "--shim", guarded.url, "--auth-token-file", tokenFile]);
      expect(status.code).toBe(0);
      expect(JSON.parse(status.stdout)).toMatchObject({
        implementation: "taskshim",
        engine: { status: "up" },
      });
      expectOneErrorLine(
        await cli(["status", "--shim", guarded.url, "--auth-token-file", join(workDir, "missing")]),
        /^taskshim: cannot read --auth-token-file: ENOENT/,
      );
    } finally {
      await guarded.stop();
    }
  });

  it("refuses a --shim that is not a URL", async () => {
    expectOneErrorLine(
      await cli(["tasks", "ls", "--shim", "not a url"]),
      /^taskshim: invalid --shim URL "not a url"/,
    );
  });
});

describe("taskshim on a Node.js outside engines", () => {
  it("refuses in one line naming the range, the node found and the way out; exit 78", async () => {
    // A node of another version, simulated: the bundle reads its version from process.versions.
    const preload = join(workDir, "node-20.cjs");
    await writeFile(preload, 'Object.defineProperty(process.versions, "node", { value: "20.20.2" });\n');
    const result = spawnSync(process.execPath, ["-r", preload, SHIM_BUNDLE, "--version"], {
      encoding: "utf8",
    });
    expect(result.status).toBe(78);
    expect(result.stdout).toBe("");
    expect(result.stderr).toBe(
      `taskshim needs Node.js ${pkg.engines.node}, but ${process.execPath} is v20.20.2: ` +
        "run the single binary (dist/taskshim), or `npm start` in the project\n",
    );
  });
});
