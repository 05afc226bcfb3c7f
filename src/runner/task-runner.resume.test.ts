/*
 * A start resumed after a restart (the container may exist already), terminate and remove on
 * their less common paths, and the host keys every live task needs.
 */
import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID, type ContainerSpec } from "../docker/docker-client.js";
import { UserKeysReconcileError } from "../host/authorized-keys.js";
import { containerNameFor } from "../tasks/container-name.js";
import { sshEd25519PublicKey, taskConfig } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { INTERRUPTED } from "../testing/fake-command-runner.js";
import { armFailpoints } from "./failpoints.js";
import { restoreTasks } from "./restore.js";
import { REGISTRY_AUTH_FILE } from "./registry-auth-file.js";
import { TaskOperationError } from "./task-runner.js";

let env: TestEnv;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  armFailpoints(undefined);
  await env.dispose();
});

describe("TaskRunner.start resumed with a recorded container", () => {
  it("starts a container that was created but never started, without creating another", async () => {
    const { task, container } = await env.seedTask({
      status: "creating",
      containerState: "created",
      startInFlight: true,
    });
    await env.runner.start(task.id);
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.docker.callsOf("startContainer").map((c) => c.args)).toEqual([[container!.id]]);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", containerId: container!.id });
  });

  it("adopts a container that already runs as it is", async () => {
    const { task, container } = await env.seedTask({
      status: "creating",
      containerState: "running",
      startInFlight: true,
    });
    await env.runner.start(task.id);
    expect(env.docker.count("createContainer")).toBe(0);
    expect(env.docker.count("startContainer")).toBe(0);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", containerId: container!.id });
  });

  it("refuses a recorded container that belongs to another task", async () => {
    const { task, container } = await env.seedTask({ status: "creating", containerState: "created" });
    container!.labels = { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: "someone-else" };
    await env.runner.start(task.id);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "creating_container_error",
      terminationMessage: `createContainer error: a container named ${task.containerName} exists and belongs to another task`,
    });
    expect(env.docker.count("startContainer")).toBe(0);
  });

  it("refuses a recorded container that another taskshim home owns", async () => {
    const { task, container } = await env.seedTask({ status: "creating", containerState: "created" });
    container!.labels = { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: task.id, [LABEL_OWNER]: "another-home" };
    await env.runner.start(task.id);
    expect(env.ctx.store.mustGet(task.id)).toMatchObject({
      status: "terminated",
      terminationReason: "creating_container_error",
      terminationMessage: `createContainer error: a container named ${task.containerName} exists and belongs to another taskshim home`,
    });
    expect(env.docker.count("startContainer")).toBe(0);
  });

  it("names a same-named container of another task when the create answers 409", async () => {
    const { config, auth } = taskConfig();
    env.docker.addContainer({ taskId: "someone-else", name: containerNameFor(config.name, config.id) });
    await env.runner.submit(config, auth);
    await env.runner.awaitStarts();
    expect(env.ctx.store.mustGet(config.id).terminationMessage).toBe(
      `createContainer error: a container named ${containerNameFor(config.name, config.id)} exists and belongs to another task`,
    );
  });

  it("reports a failed create with the engine's message", async () => {
    env.docker.failNext("createContainer", new Error("create: no space left on device"));
    const task = await env.submitAndStart();
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "creating_container_error",
      terminationMessage: "createContainer error: create: no space left on device",
    });
  });

  it("joins the last log lines of a container that fails to start", async () => {
    env.docker.failNext("startContainer", new Error("exit 1"));
    env.docker.onNext("containerLogTail", () => {
      const created = [...env.docker.containers.values()][0];
      created?.logs.push("first line", "second line");
    });
    const task = await env.submitAndStart();
    expect(task.terminationMessage).toBe("first line\nsecond line");
  });

  it("gives a task without GPUs no devices, and records the ports of a bridge task only", async () => {
    const host = await env.submitAndStart();
    const spec = env.docker.callsOf("createContainer")[0]?.args[0] as ContainerSpec;
    expect(JSON.stringify(spec)).not.toContain("/dev/dri");
    expect(host.ports).toEqual([]);
    env.docker.onNext("startContainer", () => {
      for (const c of env.docker.containers.values()) c.ports = [{ host: 32768, container: 10022 }];
    });
    const bridge = await env.submitAndStart({ network_mode: "bridge" });
    expect(bridge.ports).toEqual([{ host: 32768, container: 10022 }]);
    env.docker.onNext("startContainer", () => {
      for (const c of env.docker.containers.values()) c.ports = [{ host: 32769, container: 10022 }];
    });
    const hostAgain = await env.submitAndStart({ network_mode: "host" });
    expect(hostAgain.ports).toEqual([]);
  });
});

describe("TaskRunner.start host keys", () => {
  it("fails the task when the reconcile fails with an error that is not one user's", async () => {
    const key = sshEd25519PublicKey();
    const other = new UserKeysReconcileError("bob", { cause: new Error("EACCES") });
    vi.spyOn(env.ctx.hostKeys, "reconcile").mockRejectedValue(
      new AggregateError([new Error("lookup failed"), other], "2 users failed"),
    );
    const task = await env.submitAndStart({ host_ssh_user: "ubuntu", host_ssh_keys: [key] });
    expect(task).toMatchObject({
      status: "terminated",
      terminationReason: "executor_error",
      terminationMessage: "host ssh keys: 2 users failed",
    });
  });

  it("runs the task when only another user's keys failed", async () => {
    const other = new UserKeysReconcileError("bob", { cause: new Error("EACCES") });
    vi.spyOn(env.ctx.hostKeys, "reconcile").mockRejectedValue(new AggregateError([other], "1 user failed"));
    const task = await env.submitAndStart({
      host_ssh_user: "ubuntu",
      host_ssh_keys: [sshEd25519PublicKey()],
    });
    expect(task.status).toBe("running");
  });

  it("does not reconcile host keys for a task without keys", async () => {
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile");
    const task = await env.submitAndStart();
    expect(task.status).toBe("running");
    expect(reconcile).not.toHaveBeenCalled();
  });
});

describe("TaskRunner.hostKeysByUser", () => {
  it("lists the keys of live tasks per user, and the extra users with none", async () => {
    const a = sshEd25519PublicKey("a");
    const b = sshEd25519PublicKey("b");
    await env.seedTask({ config: { host_ssh_user: "ubuntu", host_ssh_keys: [a] } });
    await env.seedTask({ config: { host_ssh_user: "ubuntu", host_ssh_keys: [b] } });
    await env.seedTask({ config: { host_ssh_user: "", host_ssh_keys: [sshEd25519PublicKey("no user")] } });
    await env.seedTask({ config: { host_ssh_user: "carol", host_ssh_keys: [] } });
    await env.seedTask({
      status: "terminated",
      containerState: "exited",
      config: { host_ssh_user: "dave", host_ssh_keys: [sshEd25519PublicKey("d")] },
    });
    expect([...env.runner.hostKeysByUser().entries()]).toEqual([["ubuntu", [a, b]]]);
    expect([...env.runner.hostKeysByUser(["bob"]).entries()]).toEqual([
      ["bob", []],
      ["ubuntu", [a, b]],
    ]);
  });

  it("reconciles with no extra user by default, and keeps entries while a held task lives", async () => {
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile").mockResolvedValue(undefined);
    await env.runner.reconcileHostKeys();
    const first = reconcile.mock.calls[0];
    const wanted = first?.[0];
    expect(wanted).toBeTypeOf("function");
    const users = typeof wanted === "function" ? wanted() : wanted;
    expect(users).toEqual(new Map());
    expect(first?.[1]).toEqual({ keepExisting: false });
    const { task } = await env.seedTask();
    env.ctx.store.modify(task.id, (d) => (d.held = { kind: "newer-format", version: 2 }));
    await env.runner.reconcileHostKeys();
    expect(reconcile.mock.calls[1]?.[1]).toEqual({ keepExisting: true });
    env.ctx.store.modify(task.id, (d) => (d.cleanedUp = true));
    await env.runner.reconcileHostKeys();
    expect(reconcile.mock.calls[2]?.[1]).toEqual({ keepExisting: false });
  });

  it("keeps entries while a degraded task lives, not once it is terminated", async () => {
    const reconcile = vi.spyOn(env.ctx.hostKeys, "reconcile").mockResolvedValue(undefined);
    const { task } = await env.seedTask();
    env.ctx.store.modify(task.id, (d) => (d.degraded = true));
    await env.runner.reconcileHostKeys();
    env.ctx.store.modify(task.id, (d) => {
      d.status = "terminated";
      d.terminationReason = "terminated_by_user";
    });
    await env.runner.reconcileHostKeys();
    expect(reconcile.mock.calls.map((c) => c[1])).toEqual([{ keepExisting: true }, { keepExisting: false }]);
  });
});

describe("TaskRunner.terminate and remove, less common paths", () => {
  it("stops again on a repeated terminate whose first stop failed", async () => {
    const task = await env.submitAndStart();
    env.docker.failNext("stopContainer", new Error("stop: deadline exceeded"));
    await expect(env.runner.terminate(task.id, 5, "terminated_by_user", "")).rejects.toThrow(
      TaskOperationError,
    );
    const after = await env.runner.terminate(task.id, 5, "terminated_by_user", "");
    expect(env.docker.count("stopContainer")).toBe(2);
    expect(after.exitCode).toEqual(expect.any(Number));
    // Stopped now, with its exit code known: a third terminate has nothing to stop.
    await env.runner.terminate(task.id, 5, "terminated_by_user", "");
    expect(env.docker.count("stopContainer")).toBe(2);
  });

  it("terminates a task without a container without asking the engine to stop anything", async () => {
    const { task } = await env.seedTask({ status: "pending", containerState: "none" });
    const after = await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(after.status).toBe("terminated");
    expect(env.docker.count("stopContainer")).toBe(0);
  });

  it("records no exit code for a container still running after the stop returned", async () => {
    const task = await env.submitAndStart();
    vi.spyOn(env.docker, "stopContainer").mockResolvedValue(undefined);
    const after = await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    expect(after.exitCode).toBeUndefined();
  });

  it("terminates a terminated task again without writing (a full disk does not fail it)", async () => {
    const task = await env.submitAndStart();
    await env.runner.terminate(task.id, 0, "terminated_by_user", "");
    armFailpoints("durable-write:task-state=error(ENOSPC)");
    const again = await env.runner.terminate(task.id, 0, "terminated_by_server", "");
    expect(again.terminationReason).toBe("terminated_by_user");
  });

  it("removes a task that never had a container without asking the engine", async () => {
    const { task } = await env.seedTask({ status: "terminated", containerState: "none", cleanedUp: true });
    await env.runner.remove(task.id);
    expect(env.docker.count("removeContainer")).toBe(0);
    expect(env.ctx.store.get(task.id)).toBeUndefined();
  });
});

describe("TaskRunner.submit into an existing task dir", () => {
  it("fails when stale credentials cannot be deleted, and keeps the dir it did not create", async () => {
    const { config, auth } = taskConfig();
    const dir = join(env.home, "runners", containerNameFor(config.name, config.id));
    // A directory where the credentials file would be: unlink fails with something else than ENOENT.
    await mkdir(join(dir, REGISTRY_AUTH_FILE), { recursive: true });
    const error = await env.runner.submit(config, auth).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TaskOperationError);
    expect((error as Error).message).toMatch(new RegExp(`^failed to create task ${config.id}: E[A-Z]+`));
    expect(env.ctx.store.get(config.id)).toBeUndefined();
    expect(existsSync(join(dir, REGISTRY_AUTH_FILE))).toBe(true);
  });
});

describe("U9 a graceful stop during volume preparation", () => {
  const volume = { backend: "gcp", name: "data", volume_id: "vol-1", init_fs: true, device_name: "pd-data" };

  it("leaves the task preparing (never executor_error), and the next start resumes it to running", async () => {
    // The shutdown interrupts the volume command in flight (a slow blkid or mkfs, here mountpoint).
    env.commands.script = (argv) => {
      if (argv[0] !== "mountpoint") return undefined;
      env.shutdownController.abort(new Error("shim shutting down"));
      return INTERRUPTED;
    };
    const task = await env.submitAndStart({ volumes: [volume] });
    expect(task).toMatchObject({ status: "preparing", terminationReason: "" });
    expect(env.ctx.store.mustGet(task.id).startInFlight).toBe(false);

    // The restart: the same home and engine, the volume prepares this time (already mounted).
    const next = await makeContext({ home: env.home, docker: env.docker });
    try {
      next.commands.mounted.add(join(next.ctx.params.volumeMountRoot, "data"));
      const report = await restoreTasks(next.ctx);
      expect(report.resumed).toEqual([task.id]);
      await next.runner.start(task.id);
      expect(next.ctx.store.mustGet(task.id)).toMatchObject({ status: "running", terminationReason: "" });
    } finally {
      await next.dispose();
    }
  });

  it("still fails the task when a volume command fails on its own", async () => {
    env.commands.script = (argv) =>
      argv[0] === "mountpoint"
        ? {
            ...INTERRUPTED,
            kind: "exited",
            code: null,
            signal: "SIGKILL",
            stdout: Buffer.alloc(0),
            stderr: Buffer.alloc(0),
          }
        : undefined;
    const task = await env.submitAndStart({ volumes: [volume] });
    expect(task).toMatchObject({ status: "terminated", terminationReason: "executor_error" });
    expect(task.terminationMessage).toMatch(
      /^prepareVolumes error: format and mount volume data: mountpoint/,
    );
  });
});
