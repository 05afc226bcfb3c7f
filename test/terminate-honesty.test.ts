import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { bundleNodeFlags, SHIM_BUNDLE, ShimProcess, type TaskInfo } from "./support/shim-process.js";

/*
 * A terminate with a grace period on a container that traps SIGTERM and takes its time: the API
 * said `terminated` (with its reason) while the container still ran, so a control plane could
 * give its GPU to another job. dstack-shim reports the task `running` until the container has
 * stopped; so does taskshim now, with the reason recorded (durably) from the start.
 */

const run = promisify(execFile);
/** Traps SIGTERM, then takes 4 s to finish and exits 7. */
const SLOW_TO_STOP = ["sh", "-c", "trap 'sleep 4; exit 7' TERM; while true; do sleep 0.2; done"];

let shim: ShimProcess;
let images: TestImages;
let seq = 0;

function task(label: string): { id: string; name: string; image_name: string; command: string[] } {
  seq += 1;
  return {
    id: `${label}-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-${label}-${seq}`,
    image_name: images.busybox,
    command: SLOW_TO_STOP,
  };
}

async function containerRunning(id: string): Promise<boolean> {
  return (await testDocker().getContainer(id).inspect()).State.Running;
}

beforeAll(async () => {
  images = await ensureTestImages();
  shim = await ShimProcess.start();
});

afterAll(async () => {
  await shim?.stop();
});

describe("R12 honest status while a terminate waits for the container to stop", () => {
  it("R12 tasks terminate with a 10 s grace: running with no reason while the container runs, then terminated with the reason and its exit code", async () => {
    const cfg = task("honest");
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    // The CLI waits for the end, as before.
    const started = Date.now();
    const cli = run(
      process.execPath,
      [
        ...bundleNodeFlags(),
        SHIM_BUNDLE,
        "tasks",
        "terminate",
        cfg.id,
        "--timeout",
        "10s",
        "--message",
        "r12 stop",
        "--json",
        "--shim",
        shim.url,
      ],
      { timeout: 60_000 },
    );
    // During the grace: the container runs (it trapped SIGTERM), and the API says so.
    const seen: string[] = [];
    await sleep(1_000);
    while (Date.now() - started < 3_000) {
      const info = await shim.task(cfg.id);
      const alive = await containerRunning(running.container_id);
      if (!alive) break;
      seen.push(`${info.status}/${info.termination_reason}`);
      expect([info.status, info.termination_reason, info.termination_message]).toEqual(["running", "", ""]);
      await sleep(100);
    }
    expect(seen.length).toBeGreaterThan(5);
    const { stdout } = await cli;
    const final = JSON.parse(stdout) as TaskInfo & { exit_code: number | null };
    // The trap's 4 s, not the 10 s grace: the container stopped by itself.
    expect(Date.now() - started).toBeGreaterThanOrEqual(4_000);
    expect(await containerRunning(running.container_id)).toBe(false);
    expect([final.status, final.termination_reason, final.termination_message, final.exit_code]).toEqual([
      "terminated",
      "terminated_by_user",
      "r12 stop",
      7,
    ]);
    const info = (await shim.task(cfg.id)) as TaskInfo & { exit_code: number | null };
    expect([info.status, info.termination_reason, info.exit_code]).toEqual([
      "terminated",
      "terminated_by_user",
      7,
    ]);
    expect((await shim.remove(cfg.id)).status).toBe(200);
  }, 90_000);

  it("R12 a restart (kill -9) during the grace period still ends with the requested reason", async () => {
    const cfg = task("honest-kill");
    await shim.submit(cfg);
    const running = await shim.waitTask(cfg.id, (t) => t.status === "running");
    const answer = shim.terminate(cfg.id, "terminated_by_server", "r12 kill", 30).catch(() => undefined);
    await sleep(1_000);
    expect(await containerRunning(running.container_id)).toBe(true);
    expect((await shim.task(cfg.id)).status).toBe("running");
    await shim.kill();
    await answer;
    shim = await ShimProcess.start({ home: shim.home, port: shim.port });
    const final = (await shim.waitTerminated(cfg.id)) as TaskInfo & { exit_code: number | null };
    expect([final.status, final.termination_reason, final.termination_message]).toEqual([
      "terminated",
      "terminated_by_server",
      "r12 kill",
    ]);
    expect(await containerRunning(running.container_id)).toBe(false);
    const state = await testDocker().getContainer(running.container_id).inspect();
    expect(final.exit_code).toBe(state.State.ExitCode);
    expect((await shim.remove(cfg.id)).status).toBe(200);
  }, 90_000);
});
