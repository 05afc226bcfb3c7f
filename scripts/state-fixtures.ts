/*
 * Writes the task.json fixtures of one release: test/fixtures/state/<version>/<case>.task.json as
 * that release's own encoder writes them, and <case>.decoded.json, what that release's own
 * decoder reads back (src/state/state-fixtures.test.ts checks that today's decoder reads every
 * fixture of every release to the same task).
 *
 *   npx tsx scripts/state-fixtures.ts v1.0.0
 *
 * The release's source is checked out in a git worktree (its dependencies are linked from this
 * checkout's node_modules: only its state codec and task model are loaded) and its modules are
 * imported as they were at that tag, so a fixture is exactly what that release wrote.
 * Run it once when a release is cut; a release's fixtures are never edited afterwards.
 */
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const tag = process.argv[2];
if (tag === undefined || !/^v\d+\.\d+\.\d+$/.test(tag)) {
  console.error("usage: tsx scripts/state-fixtures.ts vX.Y.Z");
  process.exit(64);
}
const BOOT_ID = "6d1c2f0e-5d7e-4a0b-9a31-2b4c8e1f7a10";
const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ user@host";
const T0 = Date.UTC(2026, 11, 1, 12, 0, 0);
const repo = resolve(import.meta.dirname, "..");
const worktree = await mkdtemp(join(tmpdir(), "taskshim-fixtures-"));
const git = (...args: string[]): string => execFileSync("git", ["-C", repo, ...args], { encoding: "utf8" });

interface ReleaseModules {
  codec: {
    encodeTaskState(task: unknown, bootId: string): string;
    decodeTaskState(text: string): unknown;
  };
  config: { parseTaskConfig(body: unknown): { config: unknown } };
  task: { newTask(config: unknown): Record<string, unknown> };
}

try {
  git("worktree", "add", "--detach", worktree, tag);
  await symlink(join(repo, "node_modules"), join(worktree, "node_modules"));
  const version = (JSON.parse(await readFile(join(worktree, "package.json"), "utf8")) as { version: string })
    .version;
  const load = (path: string): Promise<unknown> => import(pathToFileURL(join(worktree, path)).href);
  const release: ReleaseModules = {
    codec: (await load("src/state/task-state-file.ts")) as ReleaseModules["codec"],
    config: (await load("src/tasks/task-config.ts")) as ReleaseModules["config"],
    task: (await load("src/tasks/task.ts")) as ReleaseModules["task"],
  };
  const out = join(repo, "test", "fixtures", "state", version);
  await mkdir(out, { recursive: true });
  for (const [name, task] of Object.entries(cases(release))) {
    const text = release.codec.encodeTaskState(task, BOOT_ID);
    await writeFile(join(out, `${name}.task.json`), text);
    const decoded = release.codec.decodeTaskState(text);
    await writeFile(join(out, `${name}.decoded.json`), `${JSON.stringify(decoded, null, 2)}\n`);
  }
  console.log(`wrote ${Object.keys(cases(release)).length} cases of ${version} to ${out}`);
} finally {
  git("worktree", "remove", "--force", worktree);
  await rm(worktree, { recursive: true, force: true });
}

/** A task in every status and with every kind of resource, built with the release's own model. */
function cases(release: ReleaseModules): Record<string, Record<string, unknown>> {
  const make = (id: string, extra: Record<string, unknown> = {}): Record<string, unknown> => {
    const { config } = release.config.parseTaskConfig({
      id,
      name: id.split("-")[0],
      image_name: "127.0.0.1:5000/team/trainer:1.2",
      registry_username: "robot",
      registry_password: "never-on-disk",
      ...extra,
    });
    return { ...release.task.newTask(config), taskDir: "/unused", createdAt: T0 };
  };
  const ran = { startedAt: T0 + 5_000 };
  const ended = { ...ran, finishedAt: T0 + 60_000, cleanedUp: true };
  return {
    pending: { ...make("pending-0001") },
    preparing: { ...make("preparing-0002"), status: "preparing" },
    pulling: { ...make("pulling-0003"), status: "pulling" },
    creating: { ...make("creating-0004"), status: "creating" },
    running: {
      ...make("running-0005", { command: ["sleep", "infinity"], env: { A: "1" } }),
      status: "running",
      ...ran,
    },
    "terminated-by-user": {
      ...make("stopped-0006"),
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "stopped by the user",
      exitCode: 143,
      ...ended,
    },
    "exited-zero": {
      ...make("done-0007"),
      status: "terminated",
      terminationReason: "done_by_runner",
      exitCode: 0,
      ...ended,
    },
    "exited-with-code": {
      ...make("failed-0008"),
      status: "terminated",
      terminationReason: "container_exited_with_error",
      terminationMessage: "exit code 3\nlast line of the log",
      exitCode: 3,
      ...ended,
    },
    "container-vanished": {
      ...make("vanished-0009"),
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "container not found",
      exitCode: null,
      ...ended,
    },
    "with-volumes": {
      ...make("vols-0010", {
        volumes: [
          { backend: "aws", name: "data", volume_id: "vol-0abc", init_fs: true, device_name: "/dev/sdf" },
        ],
        volume_mounts: [{ name: "data", path: "/data" }],
        instance_mounts: [{ instance_path: "/mnt/nfs", path: "/nfs" }],
      }),
      status: "running",
      ...ran,
    },
    "with-keys": {
      ...make("keys-0011", { host_ssh_user: "ubuntu", host_ssh_keys: [KEY], container_ssh_keys: [KEY] }),
      status: "running",
      ...ran,
    },
    "with-gpus": {
      ...make("gpus-0012", {
        gpu: 2,
        network_mode: "bridge",
        gpu_devices: [{ path_on_host: "/dev/nvidia0", path_in_container: "/dev/nvidia0" }],
        shm_size: 1073741824,
        memory: 17179869184,
        cpu: 7.5,
        privileged: true,
        container_user: "1000:1000",
      }),
      status: "running",
      gpuIds: ["GPU-0", "GPU-1"],
      ...ran,
    },
    "adopted-keys-unknown": { ...make("adopted-0013"), status: "running", degraded: true, ...ran },
  };
}
