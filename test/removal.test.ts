import { createServer, type Server, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { removeContainerViaCli } from "../src/docker/cli-removal.js";
import { DockerodeClient } from "../src/docker/dockerode-client.js";
import { RemovalUnconfirmedError } from "../src/docker/docker-errors.js";
import { OperationBound } from "../src/exec/operation-bound.js";
import { BoundedCommandRunner } from "../src/exec/run-bounded.js";
import { TEST_LABEL, testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";

let images: TestImages;
const runner = new BoundedCommandRunner();

/** Starts a `--rm` container that exits after `seconds`, so the engine removes it itself. */
async function selfRemoving(seconds: number): Promise<string> {
  const container = await testDocker().createContainer({
    Image: images.busybox,
    Cmd: ["sleep", String(seconds)],
    Labels: { [TEST_LABEL]: "1" },
    HostConfig: { AutoRemove: true },
  });
  await container.start();
  return container.id;
}

beforeAll(async () => {
  images = await ensureTestImages();
});

describe("confirmed container removal on the real engine", () => {
  it("confirms removals that race a --rm container's own removal (CLI and Engine API)", async () => {
    const api = DockerodeClient.fromEnv();
    const outcomes: string[] = [];
    for (let round = 0; round < 6; round++) {
      const id = await selfRemoving(0.3);
      // Aim at the moment the engine removes it on its own.
      await sleep(250 + round * 20);
      const result =
        round % 2 === 0 ? await removeContainerViaCli(runner, id) : await api.removeContainer(id);
      outcomes.push(result);
      expect(["removed", "already-absent"]).toContain(result);
      await expect(testDocker().getContainer(id).inspect()).rejects.toMatchObject({ statusCode: 404 });
    }
    expect(outcomes).toHaveLength(6);
  });

  it("confirms a removal of a running container and of one already gone", async () => {
    const id = await selfRemoving(300);
    expect(await removeContainerViaCli(runner, id)).toBe("removed");
    await expect(testDocker().getContainer(id).inspect()).rejects.toMatchObject({ statusCode: 404 });
    // `docker rm --force` exits 0 for a missing container; the Engine API says so exactly.
    expect(["removed", "already-absent"]).toContain(await removeContainerViaCli(runner, id));
    expect(await DockerodeClient.fromEnv().removeContainer(id)).toBe("already-absent");
  });
});

describe("an SSH launch machine that does not answer", () => {
  let server: Server;
  let port = 0;
  const sockets: Socket[] = [];

  beforeAll(async () => {
    // Accepts the TCP connection and never sends an SSH banner.
    server = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const address = server.address();
    port = typeof address === "object" && address ? address.port : 0;
  });

  afterAll(() => {
    for (const socket of sockets) socket.destroy();
    server.close();
  });

  it("ends unconfirmed within the removal deadline, with the client's cleanup evidence", async () => {
    const started = Date.now();
    let error: unknown;
    try {
      await removeContainerViaCli(
        runner,
        "job-1234abcd",
        { kind: "ssh", host: "127.0.0.1", port, connectTimeoutS: 1 },
        OperationBound.within(1_500),
      );
    } catch (e) {
      error = e;
    }
    const elapsed = Date.now() - started;
    expect(error).toBeInstanceOf(RemovalUnconfirmedError);
    const reason = (error as RemovalUnconfirmedError).reason;
    expect(["deadline", "ssh"]).toContain(reason.kind);
    if (reason.kind === "deadline")
      expect(reason.cleanup).toMatchObject({ trigger: "deadline", verified: true });
    expect(elapsed).toBeLessThan(1_500 + 1_000);
  });
});
