import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeHostKey } from "./support/chaos-host.js";
import { hasStatusCode, TEST_LABEL, testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * The ownership rule on one real engine: a shim acts only on its own containers (owner label =
 * its home's identity), on a handover (no owner label, a task.json of that id in its home), and,
 * under --adopt-unowned, on unclaimed ones. Fault matrix rows O1-O5 (docs/architecture.md).
 */

const LABEL_IS_TASK = "ai.dstack.shim.is-task";
const LABEL_TASK_ID = "ai.dstack.shim.task-id";
const LABEL_OWNER = "ai.dstack.taskshim.owner";

let images: TestImages;
let seq = 0;
const shims: ShimProcess[] = [];
const homes: string[] = [];

function ids(label: string): { id: string; name: string } {
  seq += 1;
  return { id: `${label}-${process.pid}-${seq}-${Date.now().toString(36)}`, name: `tst-own-${label}-${seq}` };
}

async function start(options: Parameters<typeof ShimProcess.start>[0] = {}): Promise<ShimProcess> {
  const shim = await ShimProcess.start(options);
  shims.push(shim);
  return shim;
}

async function home(): Promise<string> {
  const dir = await tempHome("taskshim-own-");
  homes.push(dir);
  return dir;
}

async function listedIds(shim: ShimProcess): Promise<string[]> {
  const answer = await shim.request<{ tasks: { id: string }[] }>("GET", "/api/tasks");
  expect(answer.status).toBe(200);
  return answer.json.tasks.map((t) => t.id).sort();
}

async function foreignGauge(shim: ShimProcess): Promise<number> {
  const text = (await shim.request("GET", "/metrics")).text;
  const line = text.split("\n").find((l) => l.startsWith("taskshim_foreign_containers "));
  return Number(line?.split(" ")[1] ?? Number.NaN);
}

/** A labelled container made by hand (as another tool or an older shim would). */
async function handMade(name: string, labels: Record<string, string>, extra: Record<string, unknown> = {}) {
  const container = await testDocker().createContainer({
    name,
    Image: images.busybox,
    Cmd: ["sleep", "300"],
    Labels: { [LABEL_IS_TASK]: "true", [TEST_LABEL]: "1", ...labels },
    HostConfig: { RestartPolicy: { Name: "no" }, ...((extra.HostConfig as object | undefined) ?? {}) },
  });
  await container.start();
  return container.id;
}

async function state(id: string): Promise<string> {
  try {
    return (await testDocker().getContainer(id).inspect()).State.Status;
  } catch (error) {
    if (hasStatusCode(error, 404)) return "gone";
    throw error;
  }
}

beforeAll(async () => {
  images = await ensureTestImages();
});

afterAll(async () => {
  for (const shim of shims) await shim.stop().catch(() => undefined);
  for (const dir of homes) await rm(dir, { recursive: true, force: true });
});

describe("ownership on one engine (O1–O4; U2 is O3 and O4)", () => {
  it("O1: two shims on two homes never list, stop or remove each other's containers, across restarts of both", async () => {
    const homeA = await home();
    const homeB = await home();
    let a = await start({ home: homeA });
    let b = await start({ home: homeB });
    const task = (who: string, command: string[]) => ({ ...ids(who), image_name: images.busybox, command });
    const a1 = task("a", ["sleep", "300"]);
    const a2 = task("a", ["true"]);
    const b1 = task("b", ["sleep", "300"]);
    const b2 = task("b", ["sh", "-c", "exit 3"]);
    for (const t of [a1, a2]) await a.submit(t);
    for (const t of [b1, b2]) await b.submit(t);
    const infoA1 = await a.waitTask(a1.id, (t) => t.status === "running");
    const infoB1 = await b.waitTask(b1.id, (t) => t.status === "running");
    await a.waitTerminated(a2.id);
    await b.waitTerminated(b2.id);
    const labels = (await testDocker().getContainer(infoA1.container_id).inspect()).Config.Labels ?? {};
    const idA = (await readFile(join(homeA, ".taskshim-home-id"), "utf8")).trim();
    expect(labels[LABEL_OWNER]).toBe(idA);

    for (let round = 0; round < 2; round++) {
      expect(await listedIds(a)).toEqual([a1.id, a2.id].sort());
      expect(await listedIds(b)).toEqual([b1.id, b2.id].sort());
      // Through A's API, B's tasks do not exist.
      expect((await a.terminate(b1.id)).status).toBe(404);
      expect((await a.remove(b2.id)).status).toBe(404);
      expect(await foreignGauge(a)).toBeGreaterThanOrEqual(2);
      expect(await foreignGauge(b)).toBeGreaterThanOrEqual(2);
      // Restart both: a crash of one, a graceful stop of the other.
      await a.kill();
      await b.stop();
      a = await start({ home: homeA });
      b = await start({ home: homeB });
      // B's tasks appear in A's log only as containers left alone, and the other way round.
      const mentions = (shim: ShimProcess, id: string) => shim.logs.split("\n").filter((l) => l.includes(id));
      expect(mentions(a, b1.id).every((l) => l.includes("left alone"))).toBe(true);
      expect(mentions(b, a1.id).every((l) => l.includes("left alone"))).toBe(true);
      expect(mentions(a, b1.id).length).toBeGreaterThan(0);
    }
    expect(await listedIds(a)).toEqual([a1.id, a2.id].sort());
    // A terminates and removes everything it has; B's containers are untouched.
    for (const t of [a1, a2]) {
      expect((await a.terminate(t.id)).status).toBe(200);
      expect((await a.remove(t.id)).status).toBe(200);
    }
    expect(await listedIds(a)).toEqual([]);
    expect(await state(infoB1.container_id)).toBe("running");
    expect((await b.task(b1.id)).status).toBe("running");
    expect((await b.task(b2.id)).termination_reason).toBe("container_exited_with_error");
    for (const t of [b1, b2]) {
      expect((await b.terminate(t.id)).status).toBe(200);
      expect((await b.remove(t.id)).status).toBe(200);
    }
  });

  it("O2: a hand-made foreign container is never listed, left running, and does not keep a revoked host key", async () => {
    const dir = await home();
    const carolHome = join(dir, "carol");
    await mkdir(carolHome, { recursive: true });
    const passwd = join(dir, "passwd");
    await writeFile(passwd, `carol:x:0:0::${carolHome}:/bin/sh\n`);
    const foreign = ids("foreign");
    const foreignId = await handMade(foreign.name, { [LABEL_TASK_ID]: foreign.id });
    const shim = await start({ home: join(dir, "home"), env: { TASKSHIM_PASSWD_FILE: passwd } });
    expect(await listedIds(shim)).toEqual([]);
    expect(shim.logs).toContain(foreign.name);
    const key = makeHostKey("carol@o2");
    const t = {
      ...ids("keys"),
      image_name: images.busybox,
      command: ["true"],
      host_ssh_user: "carol",
      host_ssh_keys: [key],
    };
    await shim.submit(t);
    await shim.waitTerminated(t.id);
    expect((await shim.remove(t.id)).status).toBe(200);
    const file = await readFile(join(carolHome, ".ssh", "authorized_keys"), "utf8");
    expect(file).not.toContain(key.split(" ")[1]);
    expect((await shim.terminate(foreign.id)).status).toBe(404);
    await sleep(1_000);
    expect(await state(foreignId)).toBe("running");
    await testDocker().getContainer(foreignId).remove({ force: true });
  });

  it("O3: adopts a dstack-style handover (no owner label, task.json of that id in the home)", async () => {
    const dir = await home();
    const handover = ids("handover");
    const containerId = await handMade(handover.name, { [LABEL_TASK_ID]: handover.id });
    const taskDir = join(dir, "runners", handover.name);
    await mkdir(join(taskDir, "runner"), { recursive: true, mode: 0o700 });
    // dstack-shim >= 0.21.3's v1 state: no status, no owner.
    await writeFile(
      join(taskDir, "task.json"),
      JSON.stringify({
        version: 1,
        id: handover.id,
        config: { id: handover.id, name: handover.name, image_name: images.busybox },
        termination_reason: "",
        termination_message: "",
        cleaned_up: false,
      }),
    );
    const shim = await start({ home: dir });
    expect(await listedIds(shim)).toEqual([handover.id]);
    expect((await shim.task(handover.id)).status).toBe("running");
    expect((await shim.terminate(handover.id)).status).toBe(200);
    expect((await shim.remove(handover.id)).status).toBe(200);
    expect(await state(containerId)).toBe("gone");
  });

  it("O4: --adopt-unowned takes a container without state, recovers its volume from the mounts and releases it once", async () => {
    const dir = await home();
    const root = join(dir, "volumes");
    const volume = join(root, "vol1");
    await mkdir(volume, { recursive: true });
    const mounted = (): boolean => {
      try {
        execFileSync("mountpoint", ["-q", volume]);
        return true;
      } catch {
        return false;
      }
    };
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", volume]);
    try {
      const legacy = ids("legacy");
      const containerId = await handMade(
        legacy.name,
        { [LABEL_TASK_ID]: legacy.id },
        { HostConfig: { Mounts: [{ Type: "bind", Source: volume, Target: "/data" }] } },
      );
      const args = ["--adopt-unowned", "--volume-mount-root", root];
      const shimHome = join(dir, "home");
      // Without the flag the container is foreign.
      const plain = await start({ home: shimHome });
      expect(await listedIds(plain)).toEqual([]);
      await plain.stop();
      let shim = await start({ home: shimHome, args });
      // (Any other unclaimed container on the engine would be adopted too: that is the flag.)
      expect(await listedIds(shim)).toContain(legacy.id);
      expect((await shim.terminate(legacy.id)).status).toBe(200);
      const stateFile = join(shimHome, "runners", legacy.name, "task.json");
      const deadline = Date.now() + 10_000;
      while (
        Date.now() < deadline &&
        !(existsSync(stateFile) && (await readFile(stateFile, "utf8")).includes('"cleaned_up":true'))
      )
        await sleep(50);
      const saved = JSON.parse(await readFile(stateFile, "utf8")) as Record<string, unknown>;
      expect(saved).toMatchObject({ cleaned_up: true, keys_unknown: true });
      expect(mounted()).toBe(false);

      // The volume is mounted again (for another task): a restart must not release it again.
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", volume]);
      await shim.kill();
      shim = await start({ home: shimHome, args });
      await sleep(2_000);
      expect(mounted()).toBe(true);
      expect((await shim.task(legacy.id)).status).toBe("terminated");
      expect((await shim.remove(legacy.id)).status).toBe(200);
      expect(await state(containerId)).toBe("gone");
      expect(mounted()).toBe(true);
    } finally {
      while (mounted()) execFileSync("umount", ["-l", volume]);
    }
  });
});
