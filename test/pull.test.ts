import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testDocker, testEngine } from "./support/docker.js";
import { createUniqueImage } from "./support/images.js";
import { startRegistry, type LocalRegistry } from "./support/registry.js";
import { ShimProcess } from "./support/shim-process.js";

let registry: LocalRegistry;
let shim: ShimProcess;
let seq = 0;

/** Pushes a fresh single-layer image and removes it locally, so a pull really downloads. */
async function pushedImage(repo: string): Promise<string> {
  const local = await createUniqueImage();
  const ref = await registry.push(local, repo, "v1");
  await testDocker().getImage(local).remove({ force: true });
  return ref;
}

function task(image: string, creds: { registry_username?: string; registry_password?: string }) {
  seq += 1;
  return {
    id: `pull-${process.pid}-${seq}-${Date.now().toString(36)}`,
    name: `tst-pull-${seq}`,
    image_name: image,
    command: ["true"],
    ...creds,
  };
}

beforeAll(async () => {
  registry = await startRegistry({ username: "puller", password: "s3cret-pass" });
  shim = await ShimProcess.start();
});

afterAll(async () => {
  await shim?.stop();
  await registry?.stop();
});

describe("image pulls from a local registry with auth", () => {
  it("pulls with credentials, reports progress, and runs the task", async () => {
    const image = await pushedImage("team/app");
    expect(image).toMatch(/^127\.0\.0\.1:\d+\/team\/app:v1$/);
    const cfg = task(image, { registry_username: registry.username, registry_password: registry.password });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id, 60_000);
    expect(done.termination_reason).toBe("done_by_runner");
    const progress = done.image_pull_progress;
    expect(progress).not.toBeNull();
    const pullLog = await readFile(join(shim.home, "runners", done.container_name, "pull.log"), "utf8");
    // Podman 4.3 reports a layer's bytes at most once a second (its progress interval), none for
    // a pull that ends sooner: a local pull has no byte counts there (TESTING.md, "Two engines").
    if (testEngine() === "docker") {
      expect(progress?.total_bytes).toBeGreaterThan(0);
      expect(progress?.downloaded_bytes).toBe(progress?.total_bytes);
      expect(progress?.extracted_bytes).toBe(progress?.total_bytes);
      expect(progress?.is_total_bytes_final).toBe(true);
      expect(pullLog).toContain("Downloading");
    } else {
      expect(pullLog).toContain("Pulling fs layer");
    }
    expect(pullLog).toContain("Status: Downloaded newer image");
    // Credentials never reach the task's files or the shim's logs.
    const state = await readFile(join(shim.home, "runners", done.container_name, "task.json"), "utf8");
    expect(state).not.toContain(registry.password);
    expect(pullLog).not.toContain(registry.password);
    expect(shim.logs).not.toContain(registry.password);
    expect(await readFile(join(shim.home, "shim.log"), "utf8")).not.toContain(registry.password);
  });

  it("ends with creating_container_error and a clear message on wrong credentials", async () => {
    const image = await pushedImage("team/private");
    const cfg = task(image, { registry_username: registry.username, registry_password: "wrong-password" });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id, 60_000);
    expect(done.termination_reason).toBe("creating_container_error");
    expect(done.termination_message).toMatch(/^pullImage error: /);
    expect(done.termination_message).toMatch(/unauthorized|authentication required/);
    expect(done.container_id).toBe("");
  });

  it("treats a failure in the middle of the stream as a failed pull", async () => {
    const image = await pushedImage("team/broken");
    await registry.deleteBlobsOf("team/broken");
    const cfg = task(image, { registry_username: registry.username, registry_password: registry.password });
    await shim.submit(cfg);
    const done = await shim.waitTerminated(cfg.id, 60_000);
    expect(done.termination_reason).toBe("creating_container_error");
    // The registry's 404 for the blob, in each engine's words.
    expect(done.termination_message).toMatch(
      testEngine() === "podman"
        ? /Error fetching blob: invalid status code from registry 404/
        : /unknown blob/,
    );
    expect(done.container_id).toBe("");
    const containers = await testDocker().listContainers({
      all: true,
      filters: { label: [`ai.dstack.shim.task-id=${cfg.id}`] },
    });
    expect(containers).toHaveLength(0);
  });

  it("rejects an invalid image reference with 400 and creates nothing", async () => {
    const answer = await shim.request("POST", "/api/tasks", task("UPPER/Case:..", {}));
    expect(answer.status).toBe(400);
    expect(answer.text).toMatch(/image/i);
  });
});
