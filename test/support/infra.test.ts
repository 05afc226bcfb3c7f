import { randomBytes } from "node:crypto";
import { PassThrough } from "node:stream";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import {
  hasStatusCode,
  progressError,
  readProgress,
  removeTestContainers,
  TEST_LABEL,
  testDocker,
} from "./docker.js";
import { createUniqueImage, ensureTestImages, type TestImages } from "./images.js";
import { type LocalRegistry, startRegistry } from "./registry.js";

const docker = testDocker();

describe("test infrastructure", () => {
  let images: TestImages;

  beforeAll(async () => {
    images = await ensureTestImages();
  });

  afterAll(async () => {
    await removeTestContainers();
  });

  it("runs a command in the local busybox image", async () => {
    const container = await docker.createContainer({
      name: `tst-infra-${randomBytes(4).toString("hex")}`,
      Image: images.busybox,
      Cmd: ["echo", "hello"],
      Labels: { [TEST_LABEL]: "1" },
      HostConfig: { NetworkMode: "none" },
    });
    try {
      await container.start();
      const { StatusCode } = (await container.wait()) as { StatusCode: number };
      const logs = await container.logs({ stdout: true, stderr: true });
      expect(StatusCode).toBe(0);
      expect(demux(logs)).toBe("hello\n");
    } finally {
      await container.remove({ force: true });
    }
  });

  it("has a runner image where sshd is on the PATH", async () => {
    const out = new PassThrough();
    const chunks: Buffer[] = [];
    out.on("data", (chunk: Buffer) => chunks.push(chunk));
    const [result, container] = (await docker.run(
      images.runner,
      ["sh", "-c", "command -v sshd && sshd"],
      out,
      {
        Labels: { [TEST_LABEL]: "1" },
        HostConfig: { AutoRemove: true, NetworkMode: "none" },
      },
    )) as [{ StatusCode: number }, unknown];
    expect(container).toBeDefined();
    expect(result.StatusCode).toBe(0);
    expect(Buffer.concat(chunks).toString()).toContain("/usr/sbin/sshd");
  });

  describe("local registry", () => {
    let registry: LocalRegistry;
    let ref: string;
    const pulled: string[] = [];

    beforeAll(async () => {
      registry = await startRegistry();
      // A unique layer, removed locally after the push, so the pulls below really download it.
      const unique = await createUniqueImage();
      ref = await registry.push(unique, "infra/busybox", "1");
      await docker.getImage(unique).remove();
    });

    afterAll(async () => {
      for (const image of pulled) await docker.getImage(image).remove({ force: true }).catch(ignore404);
      await registry.stop();
    });

    const auth = (password: string) => ({
      username: registry.username,
      password,
      serveraddress: registry.host,
    });

    it("serves the pushed image with good credentials", async () => {
      expect(ref).toBe(`${registry.host}/infra/busybox:1`);
      const messages = await readProgress(await docker.pull(ref, { authconfig: auth(registry.password) }));
      pulled.push(ref);
      expect(progressError(messages)).toBeUndefined();
      expect(messages.map((m) => m.status)).toContain("Pull complete");
      await docker.getImage(ref).remove(); // drop the layer again for the mid-stream case
    });

    it("refuses bad credentials before streaming", async () => {
      const failure = await docker.pull(ref, { authconfig: auth("wrong") }).then(
        () => undefined,
        (err: unknown) => err,
      );
      expect(failure).toBeInstanceOf(Error);
      expect(String(failure)).toMatch(/unauthorized|authentication required/i);
    });

    it("fails mid-stream once the layer blobs are gone", async () => {
      await registry.deleteBlobsOf("infra/busybox");
      const stream = await docker.pull(ref, { authconfig: auth(registry.password) }); // HTTP 200
      const messages = await readProgress(stream);
      pulled.push(ref);
      expect(messages.map((m) => m.status)).toContain("Pulling fs layer");
      expect(progressError(messages)).toMatch(/unknown blob|blob unknown/i);
    });
  });
});

/** Strip the 8-byte multiplexing headers of a non-TTY container log. */
function demux(raw: Buffer): string {
  let out = "";
  for (let at = 0; at + 8 <= raw.length;) {
    const size = raw.readUInt32BE(at + 4);
    out += raw.subarray(at + 8, at + 8 + size).toString("utf8");
    at += 8 + size;
  }
  return out;
}

function ignore404(err: unknown): void {
  if (!hasStatusCode(err, 404)) throw err;
}
