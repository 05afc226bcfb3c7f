import { existsSync, readFileSync } from "node:fs";
import { chmod, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitFor } from "../src/testing/wait-for.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/**
 * A workload that wrecks the dir mounted into its container (the task's `runner/` dir) and looks
 * for the shim's state beside it: exit 3 if it can see `../task.json` from inside, else it empties
 * the dir, forges a `task.json` in it and ends with 0.
 */
const WRECKING_RUNNER = `#!/bin/sh
test -e /tmp/runner/../task.json && exit 3
rm -rf /tmp/runner/*
printf '{"version":1,"id":"forged","status":"running","termination_reason":""}\\n' > /tmp/runner/task.json
exit 0
`;

let shim: ShimProcess;
let images: TestImages;
let runnerBinary: string;

beforeAll(async () => {
  images = await ensureTestImages();
  runnerBinary = join(await tempHome("taskshim-wrecker-"), "dstack-runner");
  await writeFile(runnerBinary, WRECKING_RUNNER);
  await chmod(runnerBinary, 0o755);
  shim = await ShimProcess.start({ args: ["--runner-binary-path", runnerBinary] });
});

afterAll(async () => {
  await shim?.stop();
});

describe("a workload and its mounted dir", () => {
  it("S7: cannot see the task's state from inside; wrecking its dir changes nothing the shim keeps", async () => {
    const id = `wreck-${process.pid}-${Date.now().toString(36)}`;
    await shim.submit({ id, name: "tst-wreck", image_name: images.runner });
    const done = await shim.waitTerminated(id);
    // Exit 0 (not 3): the container never saw task.json.
    expect(done).toMatchObject({ termination_reason: "done_by_runner", exit_code: 0 });
    const taskDir = join(shim.home, "runners", done.container_name);
    // The terminal status is visible at once and durable just after (before the release).
    const stored = (): Record<string, unknown> =>
      JSON.parse(readFileSync(join(taskDir, "task.json"), "utf8")) as Record<string, unknown>;
    await waitFor(() => stored().status === "terminated", {
      timeoutMs: 10_000,
      what: "task.json terminated",
    });
    expect(stored()).toMatchObject({ id, termination_reason: "done_by_runner", exit_code: 0 });
    // The forged file sits in the mounted dir only, and a restart reads the real state.
    expect(existsSync(join(taskDir, "runner", "task.json"))).toBe(true);
    await shim.stop();
    shim = await ShimProcess.start({ home: shim.home, args: ["--runner-binary-path", runnerBinary] });
    expect(await shim.task(id)).toMatchObject({
      id,
      status: "terminated",
      termination_reason: "done_by_runner",
      exit_code: 0,
    });
    expect((await shim.remove(id)).status).toBe(200);
    expect(existsSync(taskDir)).toBe(false);
  });
});
