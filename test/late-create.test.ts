import { request, createServer, type Server } from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DockerodeClient } from "../src/docker/dockerode-client.js";
import { DockerUnavailableError } from "../src/docker/docker-errors.js";
import { plainContainerSpec } from "../src/testing/container-specs.js";
import { hasStatusCode, TEST_LABEL, testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";

/** The engine's own socket (the tests' engine is local: `unix://` or the default). */
function engineSocket(): string {
  const host = process.env.DOCKER_HOST ?? "";
  if (host === "") return "/var/run/docker.sock";
  if (host.startsWith("unix://")) return host.slice("unix://".length);
  throw new Error(`this test needs a unix socket engine, not ${host}`);
}

/**
 * A proxy in front of the engine that passes every request on at once but holds the answer to a
 * container create for `delayMs`: the engine has created the container, the client hears of it
 * late. A client that hangs up meanwhile never hears of it at all.
 */
async function slowCreateProxy(socketPath: string, delayMs: number): Promise<Server> {
  const upstreamPath = engineSocket();
  const server = createServer((req, res) => {
    const isCreate = req.method === "POST" && /\/containers\/create(\?|$)/.test(req.url ?? "");
    const upstream = request(
      { socketPath: upstreamPath, path: req.url, method: req.method, headers: req.headers },
      (answer) => {
        void (async () => {
          if (isCreate) await sleep(delayMs);
          if (res.destroyed) return answer.resume();
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        })();
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  return server;
}

let images: TestImages;
let dir: string;
let proxy: Server;

beforeAll(async () => {
  images = await ensureTestImages();
  dir = await mkdtemp(join(tmpdir(), "taskshim-late-create-"));
  proxy = await slowCreateProxy(join(dir, "engine.sock"), 1_500);
});
afterAll(async () => {
  proxy.closeAllConnections();
  await new Promise<void>((resolve) => proxy.close(() => resolve()));
  await rm(dir, { recursive: true, force: true });
});

describe("a container create answered after its deadline", () => {
  it("fails at the deadline and leaves no container on the engine once the answer arrives", async () => {
    const name = `tst-late-create-${process.pid}-${Date.now()}`;
    const client = new DockerodeClient({ socketPath: join(dir, "engine.sock") }, undefined, 30_000, 300);
    const started = performance.now();
    const error = await client
      .createContainer(plainContainerSpec({ name, image: images.busybox, labels: { [TEST_LABEL]: "1" } }))
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(performance.now() - started).toBeLessThan(1_200);
    expect(error).toBeInstanceOf(DockerUnavailableError);
    // The engine created it all the same: the create was carried out, only its answer is late.
    const docker = testDocker();
    expect((await docker.getContainer(name).inspect()).Name).toBe(`/${name}`);

    await client.lateCreatesSettled();
    const gone = await docker
      .getContainer(name)
      .inspect()
      .then(
        () => false,
        (e: unknown) => hasStatusCode(e, 404),
      );
    expect(gone).toBe(true);
  });
});
