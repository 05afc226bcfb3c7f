import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { pollUntil } from "./support/service-runner.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";
import { startSwitchProxy, type SwitchProxy } from "./support/switch-proxy.js";

/*
 * A home is bound to the engine its containers live on. Two real engines side by side on this
 * machine: Docker, and the private rootful Podman that scripts/ensure-engine.mjs serves (CI sets
 * it up before the tests; without it here, these tests are skipped, never under CI=true).
 */

const DOCKER_SOCKET = "/var/run/docker.sock";
const PODMAN_SOCKET = "/run/taskshim-podman/podman.sock";
const withPodman = existsSync(PODMAN_SOCKET);
if (!withPodman && process.env.CI === "true") {
  throw new Error(
    `CI=true: Podman's socket ${PODMAN_SOCKET} is missing (scripts/test-engines.mjs sets it up)`,
  );
}

let images: TestImages;
let seq = 0;
const started: ShimProcess[] = [];
let proxy: SwitchProxy | undefined;

async function start(options: Parameters<typeof ShimProcess.start>[0]): Promise<ShimProcess> {
  const shim = await ShimProcess.start(options);
  started.push(shim);
  return shim;
}

function task() {
  seq += 1;
  const id = `engine-binding-${process.pid}-${seq}`;
  return { id, name: id, image_name: images.busybox, command: ["sh", "-c", "sleep 3600"] };
}

async function containerState(id: string): Promise<string> {
  return (await testDocker(`unix://${DOCKER_SOCKET}`).getContainer(id).inspect()).State.Status;
}

beforeAll(async () => {
  images = await ensureTestImages(testDocker(`unix://${DOCKER_SOCKET}`));
});

afterAll(async () => {
  for (const shim of started) await shim.stop().catch(() => undefined);
  await proxy?.stop();
  const docker = testDocker(`unix://${DOCKER_SOCKET}`);
  for (const c of await docker.listContainers({ all: true })) {
    if ((c.Labels["ai.dstack.shim.task-id"] ?? "").startsWith("engine-binding-")) {
      await docker.getContainer(c.Id).remove({ force: true });
    }
  }
});

const DOCKER_ENV = { DOCKER_HOST: `unix://${DOCKER_SOCKET}` };

/** A shim on Docker with one running task, stopped: the home is bound to Docker. */
async function runningOnDockerThenStopped() {
  const first = await start({ env: DOCKER_ENV });
  const submitted = task();
  await first.submit(submitted);
  const running = await first.waitTask(submitted.id, (t) => t.status === "running", 60_000);
  await first.stop();
  return { env: DOCKER_ENV, first, submitted, running };
}

describe.skipIf(!withPodman)("a home bound to its engine", () => {
  it("D10 refuses a restart against another engine (--engine-url or DOCKER_HOST), with the container running on", async () => {
    const { env, first, submitted, running } = await runningOnDockerThenStopped();
    const record = JSON.parse(await readFile(join(first.home, ".taskshim-engine.json"), "utf8")) as Record<
      string,
      unknown
    >;
    expect(record).toMatchObject({
      version: 1,
      kind: "docker",
      root_dir: "/var/lib/docker",
      url: env.DOCKER_HOST,
    });
    const taskJson = join(first.home, "runners", running.container_name, "task.json");
    const before = await readFile(taskJson, "utf8");

    for (const options of [
      { env, args: ["--engine-url", `unix://${PODMAN_SOCKET}`] },
      { env: { DOCKER_HOST: `unix://${PODMAN_SOCKET}` } },
    ]) {
      const other = await start({ home: first.home, waitReady: false, ...options });
      expect(await other.waitExit()).toBe(78);
      const lines = other.logs.split("\n").filter((l) => l.startsWith("taskshim: "));
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(
        /this home's containers live on docker \S+ \(\/var\/lib\/docker\) at unix:\/\/\/var\/run\/docker.sock, but unix:\/\/\/run\/taskshim-podman\/podman.sock is podman/,
      );
    }
    expect(await containerState(running.container_id)).toBe("running");
    expect(await readFile(taskJson, "utf8")).toBe(before);

    // Its own engine again: the task is there as it was.
    const again = await start({ home: first.home, env });
    expect(await again.task(submitted.id)).toMatchObject({
      status: "running",
      container_id: running.container_id,
    });
    await again.stop();
  });

  it("D12 moves a home with --engine-url once no container of it runs on the recorded engine", async () => {
    const { first, running } = await runningOnDockerThenStopped();
    // Live on Docker: refused even with --engine-url.
    const refused = await start({
      home: first.home,
      waitReady: false,
      args: ["--engine-url", `unix://${PODMAN_SOCKET}`],
    });
    expect(await refused.waitExit()).toBe(78);
    expect(refused.logs).toContain("the move is refused because 1 container(s) of this home still run there");
    // Stopped there: the move goes through, and later starts find the new engine by the record.
    await testDocker(`unix://${DOCKER_SOCKET}`).getContainer(running.container_id).stop({ t: 0 });
    const moved = await start({ home: first.home, args: ["--engine-url", `unix://${PODMAN_SOCKET}`] });
    expect(moved.logs).toContain("this home moved to another engine");
    await moved.stop();
    const record = JSON.parse(await readFile(join(first.home, ".taskshim-engine.json"), "utf8")) as Record<
      string,
      unknown
    >;
    expect(record).toMatchObject({ kind: "podman", url: `unix://${PODMAN_SOCKET}` });
    const { DOCKER_HOST: _unset, ...withoutHost } = process.env;
    const next = await ShimProcess.start({ home: first.home, env: { ...withoutHost, DOCKER_HOST: "" } });
    started.push(next);
    const health = await next.request<{ engine: { kind: string } }>("GET", "/api/healthcheck");
    expect(health.json.engine.kind).toBe("podman");
    await next.stop();
  });

  it("D11 an engine changed under a running shim: nothing finalized until its own engine answers again", async () => {
    const home = await tempHome();
    proxy = await startSwitchProxy(join(home, "engine.sock"), DOCKER_SOCKET);
    const shim = await start({ home, env: { DOCKER_HOST: proxy.url } });
    const submitted = task();
    await shim.submit(submitted);
    const running = await shim.waitTask(submitted.id, (t) => t.status === "running", 60_000);

    proxy.switchTo(PODMAN_SOCKET);
    await pollUntil(async () => {
      const health = await shim.request<{ engine: { status: string; error?: string } }>(
        "GET",
        "/api/healthcheck",
      );
      if (health.json.engine.status !== "mismatch") throw new Error(JSON.stringify(health.json.engine));
      expect(health.json.engine.error).toMatch(/the engine answering is podman .*not this home's docker/);
    }, 15_000);
    // Several ticks on the wrong engine: the task stays running, its container untouched.
    await sleep(3_000);
    expect(await shim.task(submitted.id)).toMatchObject({ status: "running", termination_reason: "" });
    expect(await containerState(running.container_id)).toBe("running");
    expect(shim.logs).toContain(
      "the engine changed under the shim; nothing is finalized, released or removed",
    );

    proxy.switchTo(DOCKER_SOCKET);
    await pollUntil(async () => {
      const health = await shim.request<{ engine: { status: string } }>("GET", "/api/healthcheck");
      if (health.json.engine.status !== "up") throw new Error(health.json.engine.status);
    }, 15_000);
    expect(await shim.task(submitted.id)).toMatchObject({
      status: "running",
      container_id: running.container_id,
    });
    // And it reconciles again: an exit now is final.
    await testDocker(`unix://${DOCKER_SOCKET}`).getContainer(running.container_id).kill();
    expect(await shim.waitTerminated(submitted.id)).toMatchObject({
      termination_reason: "container_exited_with_error",
    });
    await shim.stop();
  });
});
