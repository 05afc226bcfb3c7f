import { execFileSync } from "node:child_process";
import { mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  ENGINE_RECORD_FILE,
  loadEngineRecord,
  writeEngineRecord,
  type EngineRecord,
} from "./engine-record.js";

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "taskshim-engine-record-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

const RECORD: EngineRecord = {
  kind: "docker",
  id: "2XPC:EZGC",
  rootDir: "/var/lib/docker",
  url: "unix:///var/run/docker.sock",
  boundAt: "2026-12-04T17:00:00.000Z",
};

describe("the engine record", () => {
  it("is absent in a new home, and reads back what was written", async () => {
    expect(await loadEngineRecord(home)).toBeUndefined();
    await writeEngineRecord(home, RECORD);
    expect(await loadEngineRecord(home)).toEqual(RECORD);
  });

  it("stops a start on a damaged, newer-format, oversized or symlinked record, naming it", async () => {
    const path = join(home, ENGINE_RECORD_FILE);
    const cases: [string | (() => Promise<void>), RegExp][] = [
      ["{not json", /is not JSON: restore it, or delete it/],
      [
        JSON.stringify({ version: 1, kind: "lxc", id: "", root_dir: "/x", url: "", bound_at: "" }),
        /is damaged/,
      ],
      [JSON.stringify({ version: 2 }), /format 2, written by a newer taskshim/],
      ["x".repeat(20_000), /bytes long/],
      [async () => symlink("/etc/hostname", path), /is a symlink/],
    ];
    for (const [content, message] of cases) {
      await rm(path, { force: true });
      if (typeof content === "string") await writeFile(path, content);
      else await content();
      await expect(loadEngineRecord(home)).rejects.toThrow(message);
    }
  });

  it("never blocks on a FIFO where the record should be", async () => {
    execFileSync("mkfifo", [join(home, ENGINE_RECORD_FILE)]);
    await expect(loadEngineRecord(home)).rejects.toThrow(/not a regular file/);
  });
});
