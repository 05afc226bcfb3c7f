import { readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import { ShimProcess, tempHome } from "./support/shim-process.js";

const tempDirs: string[] = [];
async function tempDir(prefix: string): Promise<string> {
  const dir = await tempHome(prefix);
  tempDirs.push(dir);
  return dir;
}

/* Secrets hygiene of a real shim: the token file's mode, the log's mode, URLs in logs. */

const started: ShimProcess[] = [];
afterAll(async () => {
  for (const shim of started) await shim.stop().catch(() => undefined);
  for (const dir of tempDirs.splice(0))
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
});

async function start(options: Parameters<typeof ShimProcess.start>[0]): Promise<ShimProcess> {
  const shim = await ShimProcess.start(options);
  started.push(shim);
  return shim;
}

describe("secrets", () => {
  it("refuses a token file readable by group or others with one line naming chmod 600", async () => {
    const home = await tempDir("taskshim-secrets-");
    const tokenFile = join(home, "token");
    await writeFile(tokenFile, "secret-token-0123456789abcdef\n", { mode: 0o644 });
    const shim = await start({ home, args: ["--auth-token-file", tokenFile], waitReady: false });
    // A configuration error (EX_CONFIG): restarting cannot help, so `taskshim supervise` stops.
    expect(await shim.waitExit()).toBe(78);
    expect(shim.logs.trim().split("\n")).toEqual([
      `taskshim: configuration error: the auth token file ${tokenFile} is accessible by group or others: chmod 600 ${tokenFile}`,
    ]);
  });

  it("keeps shim.log 0600 and logs a failed download's URL without userinfo or query string", async () => {
    const home = await tempDir("taskshim-secrets-");
    const logFile = join(home, "shim.log");
    await writeFile(logFile, "", { mode: 0o644 });
    const shim = await start({ home, args: ["--runner-binary-path", join(home, "dstack-runner")] });
    expect((await stat(logFile)).mode & 0o777).toBe(0o600);
    const url = "http://bob:HunterPW22@127.0.0.1:9/runner?X-Amz-Signature=deadbeef";
    const answer = await shim.request("POST", "/api/components/install", { name: "dstack-runner", url });
    expect(answer.status).toBe(200);
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && !shim.logs.includes("component install failed")) await sleep(50);
    expect(shim.logs).toContain("component install failed");
    expect(shim.logs).toContain("http://127.0.0.1:9/runner");
    const written = await readFile(logFile, "utf8");
    for (const secret of ["HunterPW22", "X-Amz-Signature", "deadbeef"]) {
      expect(shim.logs).not.toContain(secret);
      expect(written).not.toContain(secret);
    }
  });
});
