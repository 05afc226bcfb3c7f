/*
 * The pull step: progress while it runs, pull.log, the message of a pull that fails, and
 * cancelling pulls at shutdown.
 */
import { mkdir } from "node:fs/promises";
import { statSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { pullStream, stalledPullStream, SUCCESSFUL_PULL_LINES } from "../testing/pull-streams.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { waitFor } from "../testing/wait-for.js";

let env: TestEnv;

beforeEach(async () => {
  env = await makeContext();
});
afterEach(async () => {
  await env.dispose();
});

describe("TaskRunner pull", () => {
  it("shows the progress of a pull while it is in flight", async () => {
    // Progress is taken at most every 100 ms: the "Downloading" line comes 150 ms after the first.
    env.docker.pullScript = (_ref, _auth, signal) =>
      Readable.from(
        (async function* () {
          yield Buffer.from(`${SUCCESSFUL_PULL_LINES[1]}\n`);
          await sleep(150);
          yield* stalledPullStream(SUCCESSFUL_PULL_LINES.slice(2, 3), signal);
        })(),
      );
    const task = await env.submit();
    await waitFor(() => env.ctx.store.mustGet(task.id).pullProgress?.downloaded_bytes === 512);
    expect(env.ctx.store.mustGet(task.id).pullProgress).toMatchObject({
      downloaded_bytes: 512,
      total_bytes: 1024,
    });
  });

  it("writes pull.log owner-only, and a pull.log it cannot write never fails the start", async () => {
    const task = await env.submitAndStart();
    expect(task.status).toBe("running");
    expect(statSync(join(task.taskDir, "pull.log")).mode & 0o777).toBe(0o600);

    const { task: blocked } = await env.seedTask({ status: "pending", containerState: "none" });
    await mkdir(join(blocked.taskDir, "pull.log"));
    await env.runner.start(blocked.id);
    expect(env.ctx.store.mustGet(blocked.id).status).toBe("running");
  });

  it("says how far a failed pull got", async () => {
    const registryError = "received unexpected HTTP status: 502 Bad Gateway";
    env.docker.pullScript = () =>
      pullStream([
        ...SUCCESSFUL_PULL_LINES.slice(0, 3),
        JSON.stringify({ errorDetail: { message: registryError }, error: registryError }),
      ]);
    const task = await env.submitAndStart();
    expect(task.terminationMessage).toBe(
      `pullImage error: failed pulling busybox:1.36 (downloaded 512 of 1024 bytes): image pull failed: ${registryError}`,
    );
  });
});

describe("TaskRunner.cancelPulls", () => {
  it("aborts every pull in flight, saying the shim shuts down", async () => {
    env.docker.pullScript = (_ref, _auth, signal) =>
      stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
    await env.submit();
    await env.submit();
    await waitFor(() => env.docker.count("pullImage") === 2);
    env.runner.cancelPulls();
    await env.runner.awaitStarts();
    expect(env.docker.callsOf("pullImage").map((c) => c.signal?.reason as unknown)).toEqual([
      new Error("shim shutting down"),
      new Error("shim shutting down"),
    ]);
  });
});
