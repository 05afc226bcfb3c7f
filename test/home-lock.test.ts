import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/*
 * The home lock cannot be deleted (fault matrix row O6): a second shim on the same home is
 * refused while the first lives, even after the lock file or the whole home was deleted, and
 * the first notices within 5 s that its home is gone (healthcheck `storage: degraded`).
 */

const started: ShimProcess[] = [];
const dirs: string[] = [];

async function start(options: Parameters<typeof ShimProcess.start>[0]): Promise<ShimProcess> {
  const shim = await ShimProcess.start(options);
  started.push(shim);
  return shim;
}

afterAll(async () => {
  for (const shim of started) await shim.stop().catch(() => undefined);
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

async function refused(home: string): Promise<void> {
  const second = await start({ home, waitReady: false });
  expect(await second.waitExit()).toBe(1);
  const lines = second.logs.trim().split("\n");
  expect(lines).toEqual([`taskshim: another taskshim is already running with home ${home}`]);
}

interface Health {
  storage?: { status: string; error?: string };
}

describe("the home lock (O6)", () => {
  it("refuses a second shim after the lock file and then the whole home were deleted; the first reports it within 5 s", async () => {
    const base = await tempHome("taskshim-lock-");
    dirs.push(base);
    const home = join(base, "home");
    const first = await start({ home });
    expect((await first.request<Health>("GET", "/api/healthcheck")).json.storage?.status).toBe("ok");

    await rm(join(home, ".taskshim.lock"));
    await refused(home);

    const deletedAt = Date.now();
    await rm(home, { recursive: true, force: true });
    await refused(home);
    let health: Health["storage"];
    while (Date.now() - deletedAt < 5_000) {
      health = (await first.request<Health>("GET", "/api/healthcheck")).json.storage;
      if (health?.status === "degraded") break;
      await sleep(100);
    }
    const noticedMs = Date.now() - deletedAt;
    expect(health?.status).toBe("degraded");
    expect(noticedMs).toBeLessThan(5_000);
    expect(first.logs).toContain("the shim's home was deleted or replaced");
    console.log(`home deletion noticed after ${noticedMs} ms`);

    // A home re-created at the same path is still locked, and still not the first shim's.
    await mkdir(home, { recursive: true });
    await refused(home);
    expect((await first.request<Health>("GET", "/api/healthcheck")).json.storage?.status).toBe("degraded");

    // Once the first shim is gone, the home can be used again.
    expect(await first.stop()).toBe(0);
    const next = await start({ home });
    expect((await next.request<Health>("GET", "/api/healthcheck")).json.storage?.status).toBe("ok");
  });
});
