import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_LABEL, testDocker } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

const tempDirs: string[] = [];
async function tempDir(prefix: string): Promise<string> {
  const dir = await tempHome(prefix);
  tempDirs.push(dir);
  return dir;
}

/* A start with many containers prints nothing but JSON log lines (no Node warnings). */

const CONTAINERS = 24;
let images: TestImages;
const ids: string[] = [];
let shim: ShimProcess | undefined;

beforeAll(async () => {
  images = await ensureTestImages();
});

afterAll(async () => {
  await shim?.stop().catch(() => undefined);
  await Promise.all(
    ids.map((id) =>
      testDocker()
        .getContainer(id)
        .remove({ force: true })
        .catch(() => undefined),
    ),
  );
  for (const dir of tempDirs.splice(0))
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
});

describe("noise", () => {
  it(`starts with ${CONTAINERS} containers of its home without a MaxListenersExceededWarning`, async () => {
    const home = await tempDir("taskshim-noise-");
    const homeId = `noise-${process.pid}-${Date.now()}`;
    await writeFile(join(home, ".taskshim-home-id"), `${homeId}\n`);
    for (let i = 0; i < CONTAINERS; i++) {
      const container = await testDocker().createContainer({
        name: `tst-noise-${process.pid}-${i}`,
        Image: images.busybox,
        Cmd: ["sleep", "300"],
        Labels: {
          "ai.dstack.shim.is-task": "true",
          "ai.dstack.shim.task-id": `noise-${process.pid}-${i}`,
          "ai.dstack.taskshim.owner": homeId,
          [TEST_LABEL]: "1",
        },
      });
      ids.push(container.id);
    }
    shim = await ShimProcess.start({ home });
    const tasks = await shim.request<{ tasks: unknown[] }>("GET", "/api/tasks");
    expect(tasks.json.tasks).toHaveLength(CONTAINERS);
    // Let the first ticks and the event stream run.
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect(shim.logs).not.toContain("MaxListenersExceededWarning");
    const notJson = shim.logs.split("\n").filter((line) => line !== "" && !line.startsWith("{"));
    expect(notJson).toEqual([]);
  });
});
