import { PassThrough, Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import { completePodmanPull, containerStateOf, podmanPullFinalLine } from "./podman-compat.js";
import { consumePullStream } from "./pull-progress.js";

const REF = "127.0.0.1:5000/cx/a6:v1";

/** Podman 4.3.1's compatible pull stream, as it writes it (one layer, then the image id). */
const PODMAN_PULL = [
  '{"status":"Pulling fs layer","progressDetail":{},"id":"7cb635b7b5ce"}',
  '{"status":"Downloading","progressDetail":{"current":1024,"total":2048},"id":"7cb635b7b5ce"}',
  '{"status":"Download complete","progressDetail":{},"id":"7cb635b7b5ce"}',
  '{"status":"Download complete","progressDetail":{},"id":"c11a9b24e37c"}',
];

async function read(stream: Readable): Promise<string> {
  let text = "";
  for await (const chunk of stream) text += Buffer.from(chunk as Buffer).toString("utf8");
  return text;
}

describe("completePodmanPull", () => {
  it("ends a clean Podman pull with Docker's final status once the image is there", async () => {
    const out = await read(
      completePodmanPull(Readable.from([PODMAN_PULL.join("\n") + "\n"]), REF, () => Promise.resolve(true)),
    );
    expect(out).toBe(PODMAN_PULL.join("\n") + "\n" + podmanPullFinalLine(REF) + "\n");
    const result = await consumePullStream(
      completePodmanPull(Readable.from([PODMAN_PULL.join("\n")]), REF, () => Promise.resolve(true)),
      { onMessage: () => undefined },
    );
    expect(result.lastStatus).toBe(`Status: Downloaded newer image for ${REF}`);
  });

  it("adds nothing when the image is not there, or its inspect fails: the pull stays incomplete", async () => {
    for (const confirm of [() => Promise.resolve(false), () => Promise.reject(new Error("engine gone"))]) {
      const stream = completePodmanPull(Readable.from([PODMAN_PULL.join("\n") + "\n"]), REF, confirm);
      await expect(consumePullStream(stream, { onMessage: () => undefined })).rejects.toMatchObject({
        name: "PullIncompleteError",
        lastSeenStatus: "Download complete",
      });
    }
  });

  it("leaves an error line and Docker's own final status as they are, without asking for the image", async () => {
    let asked = 0;
    const confirm = (): Promise<boolean> => {
      asked += 1;
      return Promise.resolve(true);
    };
    const failed = [
      PODMAN_PULL[0],
      '{"error":"manifest unknown","errorDetail":{"message":"manifest unknown"}}',
    ].join("\n");
    expect(await read(completePodmanPull(Readable.from([failed]), REF, confirm))).toBe(failed);
    const docker = '{"status":"Status: Image is up to date for busybox:1"}\n';
    expect(await read(completePodmanPull(Readable.from([docker]), REF, confirm))).toBe(docker);
    expect(asked).toBe(0);
  });

  it("reads lines split across chunks and a last line without a newline", async () => {
    const whole = PODMAN_PULL.join("\n");
    const chunks = [whole.slice(0, 17), whole.slice(17, 90), whole.slice(90)];
    const out = await read(completePodmanPull(Readable.from(chunks), REF, () => Promise.resolve(true)));
    expect(out).toBe(`${whole}\n${podmanPullFinalLine(REF)}\n`);
  });

  it("destroys the engine's stream when its reader destroys the returned one (an abort)", async () => {
    const source = new PassThrough();
    const stream = completePodmanPull(source, REF, () => Promise.resolve(true));
    source.write(PODMAN_PULL[0] + "\n");
    stream.destroy();
    await new Promise((resolve) => source.once("close", resolve));
    expect(source.destroyed).toBe(true);
  });
});

describe("containerStateOf", () => {
  it("keeps Docker's statuses and reads Podman's as Docker's", () => {
    for (const status of ["created", "running", "paused", "restarting", "removing", "exited", "dead"]) {
      expect(containerStateOf(status)).toBe(status);
    }
    expect(containerStateOf("stopped")).toBe("exited");
    expect(containerStateOf("configured")).toBe("created");
    expect(containerStateOf("initialized")).toBe("created");
  });

  it("never reads a stop under way, or a status it does not know, as an ended container", () => {
    expect(containerStateOf("stopping")).toBe("running");
    expect(containerStateOf("hibernating")).toBe("running");
  });
});
