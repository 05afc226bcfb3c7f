import { it, expect } from "vitest";
import { makeContext, stalledPullStream, SUCCESSFUL_PULL_LINES, taskConfig } from "./test-support.js";

const within = <T,>(p: Promise<T>, ms: number) => Promise.race([p.then(() => "done"), new Promise((r) => setTimeout(() => r("timeout"), ms))]);

it("shutdown during imageExists", async () => {
  const env = await makeContext();
  env.docker.pullScript = (_ref, _auth, signal) => stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
  env.docker.onNext("imageExists", () => env.shutdownController.abort(new Error("shim shutting down")));
  await env.submit({ gpu: 1 });
  console.log("shutdown:", await within(env.runner.awaitStarts(), 500), env.docker.callsOf("pullImage").map(c => c.signal?.aborted));
  await env.dispose();
});
it("terminate during imageExists", async () => {
  const env = await makeContext();
  env.docker.pullScript = (_ref, _auth, signal) => stalledPullStream(SUCCESSFUL_PULL_LINES.slice(0, 2), signal);
  const { config, auth } = taskConfig({ gpu: 1 });
  env.docker.onNext("imageExists", async () => { await env.runner.terminate(config.id, 0, "terminated_by_user", ""); });
  await env.runner.submit(config, auth);
  console.log("terminate:", await within(env.runner.awaitStarts(), 500), env.docker.callsOf("pullImage").map(c => c.signal?.aborted), env.ctx.gpuLock.lockedIds(), env.ctx.store.mustGet(config.id).cleanedUp);
  await env.dispose();
});
