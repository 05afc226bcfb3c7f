import { describe, expect, it } from "vitest";
import { CommandFailedError } from "../exec/run-bounded.js";
import { exited, ScriptedCommands } from "../testing/fake-command-runner.js";
import { DcgmiHealthSource, DcgmiOutputError, parseDcgmiHealth } from "./dcgmi-health.js";

/*
 * `dcgmi health -c -j` answers written in the shape dcgmi's JSON output has (DcgmiOutputJson:
 * sections under "body", children under "children", a value and its overflow lines): no such
 * output was recorded on real hardware, so these are the shapes the parser is held to.
 */

const HEALTHY = JSON.stringify({
  header: ["Health Monitor Report"],
  body: { "Overall Health": { value: "Healthy" } },
});

const INCIDENTS = JSON.stringify({
  header: ["Health Monitor Report"],
  body: {
    "Overall Health": { value: "Failure" },
    GPU: {
      children: {
        "0": {
          value: "Warning",
          children: {
            Errors: {
              children: {
                "PCIe system": {
                  value: "Warning",
                  overflow: ["Detected more than 8 PCIe replays per minute for", "GPU 0 : 99999"],
                },
              },
            },
          },
        },
        "1": {
          value: "Failure",
          children: {
            Errors: {
              children: {
                "Memory system": {
                  value: "Failure",
                  overflow: ["Detected 888 volatile double-bit ECC error(s) in GPU 1."],
                },
                "Thermal system": { value: "Warning", overflow: ["Thermal violations detected"] },
              },
            },
          },
        },
      },
    },
  },
});

describe("parseDcgmiHealth", () => {
  it("reads a healthy report: overall 0, no incident", () => {
    expect(parseDcgmiHealth(HEALTHY)).toEqual({ overall_health: 0, incidents: [] });
  });

  it("reads each entity's systems as incidents, with DCGM's system bits and entity group", () => {
    expect(parseDcgmiHealth(INCIDENTS)).toEqual({
      overall_health: 20,
      incidents: [
        {
          system: 0x1,
          health: 10,
          error_message: "Detected more than 8 PCIe replays per minute for GPU 0 : 99999",
          error_code: 0,
          entity_group_id: 1,
          entity_id: 0,
        },
        {
          system: 0x10,
          health: 20,
          error_message: "Detected 888 volatile double-bit ECC error(s) in GPU 1.",
          error_code: 0,
          entity_group_id: 1,
          entity_id: 1,
        },
        {
          system: 0x80,
          health: 10,
          error_message: "Thermal violations detected",
          error_code: 0,
          entity_group_id: 1,
          entity_id: 1,
        },
      ],
    });
  });

  it("refuses what it cannot read rather than guess a health (dstack's server accepts 0, 10, 20 only)", () => {
    expect(() => parseDcgmiHealth("Error: unable to connect")).toThrow(DcgmiOutputError);
    expect(() => parseDcgmiHealth("{}")).toThrow("no body");
    expect(() =>
      parseDcgmiHealth(JSON.stringify({ body: { "Overall Health": { value: "Internal error" } } })),
    ).toThrow('unreadable health "Internal error" at Overall Health');
  });
});

describe("DcgmiHealthSource", () => {
  const signal = new AbortController().signal;

  it("sets the watches once, then checks; --dcgm-address is dcgmi's --host", async () => {
    const commands = new ScriptedCommands((argv) => exited(0, argv.includes("-c") ? HEALTHY : "set\n"));
    const source = new DcgmiHealthSource(commands, { address: "10.0.0.5:5555" });
    await source.check(signal);
    await source.check(signal);
    expect(commands.calls.map((c) => c.argv.join(" "))).toEqual([
      "dcgmi health --host 10.0.0.5:5555 -s a",
      "dcgmi health --host 10.0.0.5:5555 -c -j",
      "dcgmi health --host 10.0.0.5:5555 -c -j",
    ]);
    expect(commands.calls.every((c) => c.bound !== undefined)).toBe(true);
  });

  it("sets the watches again after nv-hostengine forgot them, failing that one check", async () => {
    let checks = 0;
    const commands = new ScriptedCommands((argv) => {
      if (!argv.includes("-c")) return exited(0, "Health monitor systems set successfully.\n");
      checks += 1;
      return checks === 2
        ? exited(255, "Error: Health watches not enabled. Please enable watches. \n")
        : exited(0, HEALTHY);
    });
    const source = new DcgmiHealthSource(commands, { address: "" });
    await expect(source.check(signal)).resolves.toEqual({ overall_health: 0, incidents: [] });
    await expect(source.check(signal)).rejects.toThrow("watches were not set");
    await expect(source.check(signal)).resolves.toEqual({ overall_health: 0, incidents: [] });
    expect(commands.calls.filter((c) => c.argv.includes("-s"))).toHaveLength(2);
  });

  it("fails a check when dcgmi fails (nv-hostengine down) or times out", async () => {
    const down = new DcgmiHealthSource(
      new ScriptedCommands(() =>
        exited(255, "Error: unable to establish a connection to the specified host: localhost\n"),
      ),
      { address: "" },
    );
    await expect(down.check(signal)).rejects.toBeInstanceOf(CommandFailedError);
    const slow = new DcgmiHealthSource(
      new ScriptedCommands(() => ({
        kind: "expired",
        kill: { ok: true },
        operationElapsedMs: 10_000,
        cleanup: null,
      })),
      { address: "" },
    );
    await expect(slow.check(signal)).rejects.toThrow("deadline exceeded");
  });
});
