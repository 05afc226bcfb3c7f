import { readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess } from "./support/shim-process.js";

/*
 * A workload that prints hundreds of MB without a newline makes one "line" the size of its whole
 * output; the engine stores it as 16 KiB entries. The logs route answered `tail=3000` with 49 MB
 * (the shim's RSS rose by ~190 MB) and `tail=10000` with a 500 after its 10 s deadline. Now the
 * tail is streamed with a bound on bytes.
 */

const MiB = 1024 * 1024;
/** docs/api.md: the logs answer holds at most 1 MiB of output (plus the newlines between lines). */
const LOG_TAIL_MAX_BYTES = MiB;

let shim: ShimProcess;
let images: TestImages;

/** The shim process's resident set (kB), from /proc/<pid>/status. */
async function rssKb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1] ?? NaN);
}

beforeAll(async () => {
  images = await ensureTestImages();
  shim = await ShimProcess.start();
});

afterAll(async () => {
  await shim?.stop();
});

describe("D8 logs of a workload that printed 200 MB without newlines", () => {
  it("D8 answers tail=3000 and tail=10000 with 200, at most 1 MiB ending in the last line, the shim's RSS bounded", async () => {
    const id = `logs-${process.pid}-${Date.now().toString(36)}`;
    await shim.submit({
      id,
      name: "tst-logs-bound",
      image_name: images.busybox,
      command: ["sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' x; echo; echo END; sleep 3600"],
    });
    // Until the whole output is stored (the last line is END).
    const deadline = Date.now() + 120_000;
    for (;;) {
      const last = await shim.request("GET", `/api/tasks/${id}/logs?tail=1`);
      if (last.status === 200 && last.text === "END\n") break;
      if (Date.now() > deadline) throw new Error(`no END line: ${last.status} ${last.text.slice(0, 200)}`);
      await sleep(500);
    }
    const pid = shim.child.pid as number;
    const before = await rssKb(pid);
    const measured: string[] = [];
    for (const tail of [3000, 10_000, 3000]) {
      const started = Date.now();
      const answer = await shim.request("GET", `/api/tasks/${id}/logs?tail=${tail}`);
      const ms = Date.now() - started;
      expect(answer.status, answer.text.slice(0, 200)).toBe(200);
      const bytes = Buffer.byteLength(answer.text);
      measured.push(`tail=${tail}: ${bytes} bytes in ${ms} ms`);
      // The output's last MiB: the end of the x "line" (cut at its start), then END.
      expect(bytes).toBeLessThanOrEqual(LOG_TAIL_MAX_BYTES + 3);
      expect(bytes).toBeGreaterThan(LOG_TAIL_MAX_BYTES - 16);
      expect(answer.text.endsWith("xxx\nEND\n")).toBe(true);
      expect(answer.text.split("\n").length).toBe(3);
    }
    const after = await rssKb(pid);
    console.log(`D8: ${measured.join("; ")}; shim RSS ${before} kB -> ${after} kB`);
    // Before the bound: +190 MB for one tail=3000.
    expect(after - before).toBeLessThan(64 * 1024);
    await shim.terminate(id);
    await shim.remove(id);
  }, 180_000);
});
