import { execFile, spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

/*
 * The README works verbatim: every ```sh block a user types is run as written, line by line,
 * from the repo root, in a user's shell (the system's PATH and Node.js, no npm variables), after
 * the set-up (CI's own `npm ci` and this suite's build). A line starting `npm start` is a server:
 * it runs in the background until its port answers. A block preceded by
 * `<!-- readme-test: skip: <why> -->` is not run (the set-up commands themselves); ```text
 * blocks are synopses with placeholders, not commands.
 */

const exec = promisify(execFile);
const ROOT = resolve(import.meta.dirname, "..");
const README = readFileSync(join(ROOT, "README.md"), "utf8");
/** What a login shell of a fresh Debian machine has: the system's node and npm, nothing of ours. */
const USER_ENV: NodeJS.ProcessEnv = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: process.env.HOME ?? "/root",
  ...(process.env.DOCKER_HOST ? { DOCKER_HOST: process.env.DOCKER_HOST } : {}),
};

interface Block {
  readonly line: number;
  readonly commands: readonly string[];
  readonly skip?: string;
}

/** The README's ```sh blocks, each with the skip reason its marker gives. */
function shellBlocks(text: string): Block[] {
  const lines = text.split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== "```sh") continue;
    const end = lines.indexOf("```", i + 1);
    const marker = lines
      .slice(Math.max(0, i - 2), i)
      .map((l) => /^<!-- readme-test: skip: (.+) -->$/.exec(l)?.[1])
      .find((why) => why !== undefined);
    const commands = lines
      .slice(i + 1, end)
      .map((l) => l.trim())
      .filter((l) => l !== "" && !l.startsWith("#"));
    blocks.push({ line: i + 1, commands, ...(marker ? { skip: marker } : {}) });
    i = end;
  }
  return blocks;
}

const servers: ChildProcess[] = [];
const homes: string[] = [];

/** Signals a server's whole process group (bash, npm, the shim); one already gone is fine. */
const signal = (server: ChildProcess, name: NodeJS.Signals): void => {
  try {
    if (server.pid !== undefined) process.kill(-server.pid, name);
  } catch {
    // ESRCH: the group has exited
  }
};

afterAll(async () => {
  for (const server of servers) signal(server, "SIGTERM");
  await sleep(2_000);
  for (const server of servers) signal(server, "SIGKILL");
  await Promise.all(homes.map((home) => rm(home, { recursive: true, force: true })));
});

async function startServer(command: string): Promise<string> {
  const port = /--shim-http-port (\d+)/.exec(command)?.[1] ?? "10998";
  const home = /--shim-home (\S+)/.exec(command)?.[1];
  if (home) homes.push(home);
  let output = "";
  const server = spawn("bash", ["-c", command], {
    cwd: ROOT,
    env: USER_ENV,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  servers.push(server);
  server.stdout?.on("data", (c: Buffer) => (output += c.toString()));
  server.stderr?.on("data", (c: Buffer) => (output += c.toString()));
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) break;
    const up = await fetch(`http://127.0.0.1:${port}/api/healthcheck`, {
      signal: AbortSignal.timeout(1_000),
    }).then(
      (r) => r.ok,
      () => false,
    );
    if (up) return output;
    await sleep(250);
  }
  throw new Error(`\`${command}\` did not serve on port ${port}:\n${output.slice(-3000)}`);
}

describe("the README, verbatim", () => {
  const blocks = shellBlocks(README);

  it("has shell blocks to run, and says why it skips the others", () => {
    expect(blocks.filter((b) => b.skip === undefined).length).toBeGreaterThanOrEqual(2);
    for (const block of blocks) if (block.skip !== undefined) expect(block.skip.length).toBeGreaterThan(10);
  });

  it("runs every command a user types, as written, with the system's Node.js on PATH", async () => {
    const ran: string[] = [];
    for (const block of blocks.filter((b) => b.skip === undefined)) {
      for (const command of block.commands) {
        if (command.startsWith("npm start")) {
          await startServer(command);
        } else {
          const result = await exec("bash", ["-c", command], {
            cwd: ROOT,
            env: USER_ENV,
            timeout: 120_000,
          }).catch((error: { code?: number; stdout?: string; stderr?: string }) => error);
          expect(
            result,
            `README line ${block.line}: \`${command}\` failed: ${JSON.stringify(result)}`,
          ).not.toHaveProperty("code");
        }
        ran.push(command);
      }
    }
    console.log(`README: ran ${ran.length} commands:\n  ${ran.join("\n  ")}`);
    expect(ran.some((c) => c.startsWith("npx taskshim"))).toBe(true);
  }, 300_000);
});
