import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { freePort } from "../../test/support/shim-process.js";
import { compileFloor, FLOOR_SOURCE, runFloor, timeVersionPairs } from "./floor.js";

/** A stand-in engine on a unix socket: answers the container list, records what was asked. */
async function fakeEngine(
  socket: string,
  containers: unknown[],
): Promise<{ server: Server; paths: string[] }> {
  const paths: string[] = [];
  const server = createServer((req, res) => {
    paths.push(req.url ?? "");
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(containers));
  });
  await new Promise<void>((done) => server.listen(socket, done));
  return { server, paths };
}

/** Writes `<home>/runners/<name>/task.json` (or only the dir, for `undefined`). */
async function taskDir(
  home: string,
  name: string,
  state: Record<string, unknown> | undefined,
): Promise<void> {
  const dir = join(home, "runners", name);
  await mkdir(dir, { recursive: true });
  if (state !== undefined) await writeFile(join(dir, "task.json"), JSON.stringify(state));
}

describe("B3's physical floor", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "taskshim-floor-test-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("imports Node.js builtins only: no dependency, no line of the shim", async () => {
    const source = await readFile(FLOOR_SOURCE, "utf8");
    const imports = [...source.matchAll(/^import .* from "([^"]+)";$/gm)].map((m) => m[1]);
    expect(imports.length).toBeGreaterThan(0);
    for (const name of imports) expect(name).toMatch(/^node:/);
  });

  it("lists the labelled containers once, reads every task.json and answers with their statuses", async () => {
    const socket = join(dir, "engine.sock");
    const engine = await fakeEngine(socket, [
      { Names: ["/bn-up"], State: "running" },
      { Names: ["/bn-down"], State: "exited" },
      { Names: ["/someone-elses"], State: "running" },
    ]);
    try {
      const home = join(dir, "home");
      await taskDir(home, "bn-up", { id: "up", status: "running" });
      await taskDir(home, "bn-down", { id: "down", status: "running" });
      await taskDir(home, "bn-done", { id: "done", status: "terminated" });
      await taskDir(home, "bn-no-state", undefined);
      await taskDir(home, ".trash-bn-old", { id: "old", status: "running" });
      const script = await compileFloor(dir);
      // CommonJS, as the shim's bundle: Node.js strips no types and starts no ES module loader.
      expect(script).toMatch(/\.cjs$/);

      const run = await runFloor(script, { engineUrl: `unix://${socket}`, home, port: await freePort() });
      expect(Object.fromEntries(run.tasks)).toEqual({
        up: "running",
        down: "terminated",
        done: "terminated",
      });
      expect(engine.paths).toHaveLength(1);
      const asked = new URL(engine.paths[0]!, "http://engine");
      expect(asked.pathname).toBe("/containers/json");
      expect(asked.searchParams.get("all")).toBe("1");
      expect(JSON.parse(asked.searchParams.get("filters")!)).toEqual({
        label: ["ai.dstack.shim.is-task=true"],
      });
      expect(run.marks.files).toBe(3);
      expect(run.ms).toBeGreaterThan(0);
      // Its marks are in order: started, list and reads, then listening, then answered.
      expect(run.marks.listening).toBeGreaterThanOrEqual(Math.max(run.marks.listed, run.marks.read));
      expect(run.marks.answered).toBeGreaterThanOrEqual(run.marks.listening);
    } finally {
      engine.server.close();
    }
  });

  it("fails, rather than reporting a floor, when the engine does not answer", async () => {
    const home = join(dir, "home");
    await taskDir(home, "bn-up", { id: "up", status: "running" });
    const script = await compileFloor(dir);
    await expect(
      runFloor(script, { engineUrl: `unix://${join(dir, "absent.sock")}`, home, port: await freePort() }),
    ).rejects.toThrow(/exited/);
  });

  it("times the bundle's --version with its shebang's flags against node -e 0, pair by pair", async () => {
    const bundle = join(dir, "taskshim.cjs");
    await writeFile(
      bundle,
      `#!/usr/bin/env -S MALLOC_ARENA_MAX=1 node --max-semi-space-size=2\n` +
        `if (process.env.MALLOC_ARENA_MAX === "1" && process.argv[2] === "--version") console.log("taskshim version 9.9.9");\n`,
    );
    const pairs = await timeVersionPairs(bundle, 3);
    expect(pairs.version).toHaveLength(3);
    expect(pairs.bare).toHaveLength(3);
    for (const ms of [...pairs.version, ...pairs.bare]) expect(ms).toBeGreaterThan(0);
    expect(pairs.binary).toBeUndefined();
  });

  it("times a single binary's --version too when given one, round by round", async () => {
    const bundle = join(dir, "taskshim.cjs");
    await writeFile(bundle, `#!/usr/bin/env -S node\nconsole.log("taskshim version 9.9.9");\n`);
    const binary = join(dir, "taskshim");
    await writeFile(binary, `#!/bin/sh\n[ "$1" = --version ] && echo "taskshim version 9.9.9"\n`, {
      mode: 0o755,
    });
    const rounds = await timeVersionPairs(bundle, 4, binary);
    expect([rounds.version.length, rounds.binary?.length, rounds.bare.length]).toEqual([4, 4, 4]);
    await writeFile(binary, `#!/bin/sh\necho usage\n`, { mode: 0o755 });
    await expect(timeVersionPairs(bundle, 1, binary)).rejects.toThrow(/taskshim --version printed "usage/);
  });

  it("refuses a bundle whose --version prints no version", async () => {
    const bundle = join(dir, "taskshim.cjs");
    await writeFile(bundle, `#!/usr/bin/env -S node --max-semi-space-size=2\nconsole.log("usage: …");\n`);
    await expect(timeVersionPairs(bundle, 1)).rejects.toThrow(/printed/);
  });
});
