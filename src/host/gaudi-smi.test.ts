import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { EXPIRED, exited, ScriptedCommands } from "../testing/fake-command-runner.js";
import { thrown } from "../testing/thrown.js";
import { detectGaudi, HL_SMI_ARGV, parseHlSmiCsv } from "./gaudi-smi.js";
import { GpuDetectionError } from "./gpu-model.js";

/** Recorded-style `hl-smi` answers (test/fixtures/gpu/). */
const fixture = (name: string): string =>
  readFileSync(resolve(import.meta.dirname, "../../test/fixtures/gpu", name), "utf8");

describe("parseHlSmiCsv", () => {
  it("reads an 8-card Gaudi 2 host: name, memory in MiB, the index as id", () => {
    const gpus = parseHlSmiCsv(fixture("hl-smi-8x-gaudi2.csv"));
    expect(gpus).toHaveLength(8);
    expect(gpus[0]).toEqual({
      vendor: "intel",
      name: "HL-225",
      vramMiB: 98304,
      id: "0",
      index: 0,
      driverVersion: "",
    });
    expect(gpus.map((gpu) => gpu.id)).toEqual(["0", "1", "2", "3", "4", "5", "6", "7"]);
  });

  it("sorts by index, whatever order hl-smi printed", () => {
    const gpus = parseHlSmiCsv(fixture("hl-smi-4x-gaudi3-unordered.csv"));
    expect(gpus.map((gpu) => [gpu.id, gpu.name, gpu.vramMiB])).toEqual([
      ["0", "HL-325L", 131072],
      ["1", "HL-325L", 131072],
      ["2", "HL-325L", 131072],
      ["3", "HL-325L", 131072],
    ]);
  });

  it("keeps commas in a name, reads an unavailable memory size as 0, skips blank lines", () => {
    expect(parseHlSmiCsv("\r\nHL-225, rev B, N/A, 4\r\n  \n")).toEqual([
      { vendor: "intel", name: "HL-225, rev B", vramMiB: 0, id: "4", index: 4, driverVersion: "" },
    ]);
    expect(parseHlSmiCsv("")).toEqual([]);
  });

  it("refuses a line it cannot read, or one index listed twice, with the line named", () => {
    const error = thrown(() => parseHlSmiCsv("No AIPs were found"));
    expect([error.name, error.message]).toEqual([
      "GpuDetectionError",
      'unexpected hl-smi output line: "No AIPs were found"',
    ]);
    for (const line of ["HL-225, 98304", "HL-225, 98304, x", "HL-225, 98304, -1", "HL-225, 98304, 1.5"]) {
      expect(() => parseHlSmiCsv(line), line).toThrow(GpuDetectionError);
    }
    expect(thrown(() => parseHlSmiCsv("HL-225, 1, 0\nHL-225, 1, 0\n")).message).toBe(
      "hl-smi lists index 0 twice",
    );
  });
});

describe("detectGaudi", () => {
  it("runs dstack-shim's query, word for word, under a deadline", async () => {
    const commands = new ScriptedCommands(() => exited(0, fixture("hl-smi-8x-gaudi2.csv")));
    const gpus = await detectGaudi(commands);
    expect(gpus).toHaveLength(8);
    expect(HL_SMI_ARGV).toEqual([
      "hl-smi",
      "--query-aip=name,memory.total,index",
      "--format=csv,noheader,nounits",
    ]);
    expect(commands.argvs()).toEqual([
      "hl-smi --query-aip=name,memory.total,index --format=csv,noheader,nounits",
    ]);
    expect(commands.calls[0]?.bound?.remainingMs()).toBeGreaterThan(25_000);
  });

  it("fails on a non-zero exit or a deadline (the caller logs it and assumes no GPUs)", async () => {
    await expect(
      detectGaudi(new ScriptedCommands(() => exited(1, "", "hl-smi: driver not loaded"))),
    ).rejects.toThrow(/driver not loaded/);
    await expect(detectGaudi(new ScriptedCommands(() => EXPIRED))).rejects.toThrow(/deadline exceeded/);
  });
});
