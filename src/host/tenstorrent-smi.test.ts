import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EXPIRED, exited, ScriptedCommands } from "../testing/fake-command-runner.js";
import { thrown } from "../testing/thrown.js";
import { GpuDetectionError } from "./gpu-model.js";
import {
  detectTenstorrent,
  gpusFromTtSmiSnapshot,
  parseTtSmiSnapshot,
  TT_SMI_ARGV,
  type TtSmiChip,
} from "./tenstorrent-smi.js";

/** `tt-smi -s` snapshots in the tool's own shape (test/fixtures/gpu/). */
const fixture = (name: string): string =>
  readFileSync(resolve(import.meta.dirname, "../../test/fixtures/gpu", name), "utf8");

const GiB = 1024;
const summary = (chips: readonly TtSmiChip[]) =>
  gpusFromTtSmiSnapshot(chips).map((gpu) => [gpu.id, gpu.name, gpu.vramMiB / GiB]);
const chip = (boardType: string, boardId: string, busId = "0000:01:00.0"): TtSmiChip => ({
  boardType,
  boardId,
  busId,
});

describe("parseTtSmiSnapshot", () => {
  it("reads each chip's board type, board id and bus id, in the snapshot's order", () => {
    const chips = parseTtSmiSnapshot(fixture("tt-smi-4x-n300.json"));
    expect(chips).toHaveLength(8);
    expect(chips[0]).toEqual({ boardType: "n300 L", boardId: "10001451170e1a3", busId: "0000:07:00.0" });
    expect(chips[7]).toEqual({ boardType: "n300 R", boardId: "10001451170e2d4", busId: "N/A" });
  });

  it("has no chips without device_info, and empty fields where a chip lacks them", () => {
    expect(parseTtSmiSnapshot("{}")).toEqual([]);
    expect(parseTtSmiSnapshot('{"device_info": null}')).toEqual([]);
    expect(parseTtSmiSnapshot('{"device_info": []}')).toEqual([]);
    expect(parseTtSmiSnapshot('{"device_info": [{}, {"board_info": {"board_type": 7}}]}')).toEqual([
      { boardType: "", boardId: "", busId: "" },
      { boardType: "", boardId: "", busId: "" },
    ]);
  });

  it("refuses output that is not a snapshot, naming why (the parse error as cause)", () => {
    const invalid = thrown(() => parseTtSmiSnapshot("Detected Chips: 2\n{"));
    expect(invalid).toBeInstanceOf(GpuDetectionError);
    expect(invalid.message).toMatch(/^tt-smi printed invalid JSON: /);
    expect(invalid.cause).toBeInstanceOf(SyntaxError);
    expect(thrown(() => parseTtSmiSnapshot("[]")).message).toBe("tt-smi output is not a JSON object");
    expect(thrown(() => parseTtSmiSnapshot('{"device_info": {}}')).message).toBe(
      "tt-smi device_info is not an array",
    );
  });
});

describe("gpusFromTtSmiSnapshot, as dstack-shim counts them", () => {
  it("one n150: one GPU of 12 GiB, device 0", () => {
    const gpus = gpusFromTtSmiSnapshot(parseTtSmiSnapshot(fixture("tt-smi-1x-n150.json")), "1.31");
    expect(gpus).toEqual([
      { vendor: "tenstorrent", name: "n150", vramMiB: 12 * GiB, id: "0", index: 0, driverVersion: "1.31" },
    ]);
  });

  it("four n300 cards: each left chip is a GPU, its right chip adds its memory (24 GiB each)", () => {
    expect(summary(parseTtSmiSnapshot(fixture("tt-smi-4x-n300.json")))).toEqual([
      ["0", "n300", 24],
      ["1", "n300", 24],
      ["2", "n300", 24],
      ["3", "n300", 24],
    ]);
  });

  it("Blackhole: each local chip is a GPU (a p300's two included), a remote chip adds to its board's", () => {
    expect(summary(parseTtSmiSnapshot(fixture("tt-smi-blackhole-p300-p150.json")))).toEqual([
      ["0", "p300", 32],
      ["1", "p300", 32],
      ["2", "p150", 64],
    ]);
  });

  it("folds tt-smi's Blackhole names into dstack's, with their memory", () => {
    const names = ["bh-scrappy", "p100", "p100a", "p150a", "p150b", "p150c", "p300a", "p300b", "p300c"];
    expect(summary(names.map((name, i) => chip(name, `b${i}`)))).toEqual([
      ["0", "p100a", 28],
      ["1", "p100a", 28],
      ["2", "p100a", 28],
      ["3", "p150", 32],
      ["4", "p150", 32],
      ["5", "p150", 32],
      ["6", "p300", 32],
      ["7", "p300", 32],
      ["8", "p300", 32],
    ]);
  });

  it("a Galaxy: every left chip is a GPU, though all share one board id", () => {
    const chips = Array.from({ length: 32 }, (_, i) =>
      chip("tt-galaxy-wh L", "100035100000000", `0000:${i}:00.0`),
    );
    const gpus = summary(chips);
    expect(gpus).toHaveLength(32);
    expect(gpus[31]).toEqual(["31", "tt-galaxy-wh", 12]);
  });

  it("older boards without a side merge into the first GPU of their board; unknown boards have 0 memory", () => {
    expect(
      summary([
        chip("n300", "a"),
        chip("n300", "a"),
        chip("n150-custom L", "b"),
        chip("grayskull e150", "c"),
        chip("n300-custom R", "b"),
      ]),
    ).toEqual([
      ["0", "n150-custom", 24],
      ["1", "n300", 24],
      ["2", "grayskull e150", 0],
    ]);
  });

  it("lists left chips before chips without a side; a right chip adds only to a left chip's GPU, a Blackhole one of its name", () => {
    expect(
      summary([
        chip("p150b", "x"),
        chip("n150 L", "y"),
        chip("p300a L", "z"),
        // No left chip of board x: this right chip's memory counts nowhere (as in dstack-shim).
        chip("p150a R", "x"),
        // Board z's GPU is a p300: a p150 right chip is not its other half, a p300 one is.
        chip("p150a R", "z"),
        chip("p300b R", "z"),
        chip("p150b", "x", " n/a "),
      ]),
    ).toEqual([
      ["0", "n150", 12],
      ["1", "p300", 64],
      ["2", "p150", 64],
    ]);
  });
});

describe("detectTenstorrent", () => {
  let root: string;
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), "tt-root-"));
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it("runs tt-smi -s under a deadline and takes the driver version from the TT-KMD module", async () => {
    await mkdir(join(root, "sys/module/tenstorrent"), { recursive: true });
    await writeFile(join(root, "sys/module/tenstorrent/version"), "2.0.0\n");
    const commands = new ScriptedCommands(() => exited(0, fixture("tt-smi-4x-n300.json")));
    const gpus = await detectTenstorrent(commands, { root });
    expect(TT_SMI_ARGV).toEqual(["tt-smi", "-s"]);
    expect(commands.argvs()).toEqual(["tt-smi -s"]);
    expect(commands.calls[0]?.bound?.remainingMs()).toBeGreaterThan(55_000);
    expect(gpus.map((gpu) => gpu.driverVersion)).toEqual(["2.0.0", "2.0.0", "2.0.0", "2.0.0"]);
  });

  it("logs an unreadable driver version and carries on without it", async () => {
    const logs: [string, object | undefined][] = [];
    const commands = new ScriptedCommands(() => exited(0, fixture("tt-smi-1x-n150.json")));
    const gpus = await detectTenstorrent(commands, { root, log: (msg, fields) => logs.push([msg, fields]) });
    expect(gpus[0]?.driverVersion).toBe("");
    expect(logs).toEqual([
      [
        "cannot read the Tenstorrent driver version",
        {
          path: join(root, "sys/module/tenstorrent/version"),
          error: expect.stringContaining("ENOENT") as unknown,
        },
      ],
    ]);
  });

  it("fails on a non-zero exit or a deadline (the caller logs it and assumes no GPUs)", async () => {
    await expect(
      detectTenstorrent(new ScriptedCommands(() => exited(1, "", "No Tenstorrent devices"))),
    ).rejects.toThrow(/No Tenstorrent devices/);
    await expect(detectTenstorrent(new ScriptedCommands(() => EXPIRED))).rejects.toThrow(/deadline exceeded/);
  });
});
