import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID } from "../docker/docker-client.js";
import { TASK_STATE_FILE } from "../state/task-state-file.js";
import { containerNameFor } from "../tasks/container-name.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { sshEd25519PublicKey, taskConfig } from "../testing/fixtures.js";
import { makeContext, TEST_HOME_ID, type TestEnv } from "../testing/test-context.js";
import { ContainerOwnership } from "./ownership.js";
import { restoreTasks } from "./restore.js";

let env: TestEnv;
const extra: TestEnv[] = [];
beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  for (const e of extra.splice(0)) await e.dispose();
  await env.dispose();
});

async function restart(overrides: Parameters<typeof makeContext>[0] = {}): Promise<TestEnv> {
  const next = await makeContext({ home: env.home, docker: env.docker, ...overrides });
  extra.push(next);
  return next;
}

const labels = (taskId: string, owner?: string): Record<string, string> => ({
  [LABEL_IS_TASK]: "true",
  [LABEL_TASK_ID]: taskId,
  ...(owner !== undefined ? { [LABEL_OWNER]: owner } : {}),
});

describe("ContainerOwnership.classify (the one rule)", () => {
  const rule = new ContainerOwnership("home-a", false);
  const adopting = new ContainerOwnership("home-a", true);
  const none = (): boolean => false;
  const all = (): boolean => true;
  const c = (owner: string, taskId = "t1") => ({ id: "c1", name: "n", taskId, owner });

  it("own label = this home: own; another home's label: foreign, whatever the state here", () => {
    expect(rule.classify(c("home-a"), none)).toBe("own");
    expect(rule.classify(c("home-b"), all)).toBe("foreign");
    expect(adopting.classify(c("home-b"), all)).toBe("foreign");
  });

  it("no owner label: a handover when a task.json of that id is here, else foreign unless adopting", () => {
    expect(rule.classify(c(""), all)).toBe("handover");
    expect(rule.classify(c(""), none)).toBe("foreign");
    expect(adopting.classify(c(""), none)).toBe("unowned-adopted");
    expect(rule.classify(c("", ""), all)).toBe("foreign");
  });

  it("logs each foreign container once and reports the count each time", () => {
    const { log, lines } = capturingLogger();
    const counts: number[] = [];
    const ownership = new ContainerOwnership("home-a", false, log, (n) => counts.push(n));
    const list = [c("home-b"), { ...c(""), id: "c2" }, { ...c("home-a"), id: "c3" }];
    expect(ownership.filter(list, none).map((x) => x.id)).toEqual(["c3"]);
    expect(ownership.filter(list, none).map((x) => x.id)).toEqual(["c3"]);
    expect(counts).toEqual([2, 2]);
    expect(lines.filter((l) => l.includes("left alone"))).toHaveLength(2);
  });

  it("says in the log line whose a foreign container is, with its name, id, task id and owner", () => {
    const { log, lines } = capturingLogger();
    const ownership = new ContainerOwnership("home-a", false, log);
    ownership.filter([{ id: "c1", name: "other-home", taskId: "t1", owner: "home-b" }], none);
    ownership.filter([{ id: "c2", name: "unclaimed", taskId: "t2", owner: "" }], none);
    expect(lines.map((l) => JSON.parse(l) as Record<string, unknown>)).toEqual([
      expect.objectContaining({
        level: 30,
        container: "other-home",
        containerId: "c1",
        taskId: "t1",
        owner: "home-b",
        msg: "container of another taskshim home left alone",
      }),
      expect.objectContaining({
        level: 30,
        container: "unclaimed",
        containerId: "c2",
        taskId: "t2",
        owner: "",
        msg: "labelled container without owner label and without task state here left alone (see --adopt-unowned)",
      }),
    ]);
  });
});

describe("ownership in the lifecycle (O5)", () => {
  it("restore never lists another home's container nor an unclaimed one, and counts them", async () => {
    const mine = await env.submitAndStart();
    env.docker.addContainer({ name: "other-1", labels: labels("other-task", "home-b") });
    env.docker.addContainer({ name: "bare-1", labels: labels("bare-task") });
    let foreign = -1;
    const next = await restart({
      ownership: new ContainerOwnership(TEST_HOME_ID, false, undefined, (n) => (foreign = n)),
    });
    const report = await restoreTasks(next.ctx);
    expect(next.ctx.store.list().map((t) => t.id)).toEqual([mine.id]);
    expect(report.foreignContainers.sort()).toEqual(["bare-1", "other-1"]);
    expect(foreign).toBe(2);
  });

  it("a container of our task id under another home never stands in for ours, nor is stopped or removed", async () => {
    const mine = await env.submitAndStart();
    const twin = env.docker.addContainer({ name: "twin", labels: labels(mine.id, "home-b") });
    env.docker.exit(mine.containerId!, 0);
    await env.reconciler.tick();
    expect(env.ctx.store.mustGet(mine.id).terminationReason).toBe("done_by_runner");
    await env.runner.remove(mine.id);
    expect(env.docker.find(twin.id)?.state).toBe("running");
    expect(env.docker.callsOf("stopContainer").some((call) => call.args[0] === twin.id)).toBe(false);
  });

  it("a create that meets another home's container of the same name fails instead of adopting it", async () => {
    const { config } = taskConfig();
    const name = containerNameFor(config.name, config.id);
    const other = env.docker.addContainer({ name, labels: labels(config.id, "home-b"), state: "created" });
    const task = await env.submitAndStart({ id: config.id, name: config.name });
    expect(task.status).toBe("terminated");
    expect(task.terminationMessage).toContain("belongs to another taskshim home");
    expect(env.docker.find(other.id)?.state).toBe("created");
    expect(env.docker.count("startContainer")).toBe(0);
  });

  it("events of a foreign container kick nothing", async () => {
    const mine = await env.submitAndStart();
    const follow = env.reconciler.followEvents();
    env.docker.resetCalls();
    const other = env.docker.addContainer({ name: "o", labels: labels(mine.id, "home-b") });
    env.docker.exit(other.id, 1);
    await new Promise((r) => setTimeout(r, 50));
    expect(env.docker.count("inspectContainer")).toBe(0);
    env.shutdownController.abort();
    await follow;
  });

  it("adopts a dstack-style handover (no owner label, task.json here) and keeps its config", async () => {
    const seeded = await env.seedTask({ containerState: "exited", exitCode: 3 });
    const next = await restart();
    const report = await restoreTasks(next.ctx);
    expect(report.foreignContainers).toEqual([]);
    const task = next.ctx.store.mustGet(seeded.task.id);
    expect(task.degraded).toBeUndefined();
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet(seeded.task.id).exitCode).toBe(3);
  });

  it("--adopt-unowned: recovers volumes from the mounts, persists the adoption, releases once", async () => {
    const root = env.ctx.params.volumeMountRoot;
    const container = env.docker.addContainer({
      name: "legacy-0badf00d",
      labels: labels("legacy-task"),
      mounts: [
        { source: join(root, "data"), destination: "/data" },
        { source: "/etc/hosts", destination: "/etc/hosts" },
      ],
    });
    const adopting = () => new ContainerOwnership(TEST_HOME_ID, true);
    const next = await restart({ ownership: adopting() });
    const report = await restoreTasks(next.ctx);
    expect(report.adoptedUnowned).toEqual(["legacy-0badf00d"]);
    for (const id of report.changed) await next.runner.persister.persist(id);
    const task = next.ctx.store.mustGet("legacy-task");
    expect(task.degraded).toBe(true);
    expect(task.config.volumes.map((v) => v.name)).toEqual(["data"]);
    const state = JSON.parse(readFileSync(join(task.taskDir, TASK_STATE_FILE), "utf8")) as Record<
      string,
      unknown
    >;
    expect(state.keys_unknown).toBe(true);

    env.docker.exit(container.id, 0);
    next.commands.mounted.add(join(root, "data"));
    await next.reconciler.tick();
    expect(next.ctx.store.mustGet("legacy-task").cleanedUp).toBe(true);
    expect(next.commands.argvsOf("umount")).toEqual([["umount", "-qf", join(root, "data")]]);

    // A later start (the volume mounted again for another task) must not release it again.
    next.commands.mounted.add(join(root, "data"));
    const third = await restart({ ownership: adopting(), commands: next.commands });
    await restoreTasks(third.ctx);
    expect(third.ctx.store.mustGet("legacy-task")).toMatchObject({ cleanedUp: true, degraded: true });
    await third.reconciler.tick();
    expect(next.commands.argvsOf("umount")).toHaveLength(1);
    expect(next.commands.mounted.has(join(root, "data"))).toBe(true);
  });

  it("a foreign container does not keep a revoked host key in authorized_keys", async () => {
    env.docker.addContainer({ name: "foreign-1", labels: labels("foreign-1") });
    const key = sshEd25519PublicKey("carol@ci");
    const next = await restart();
    await restoreTasks(next.ctx);
    const submitted = await next.submitAndStart({ host_ssh_user: "carol", host_ssh_keys: [key] });
    const file = join(next.userHome("carol"), ".ssh", "authorized_keys");
    expect(readFileSync(file, "utf8")).toContain(key.split(" ")[1]);
    await next.runner.terminate(submitted.id, 0, "terminated_by_user", "");
    expect(readFileSync(file, "utf8")).not.toContain(key.split(" ")[1]);
  });
});
