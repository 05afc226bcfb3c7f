import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { LogFormat } from "../config/shim-config.js";
import { createLogger, logsAsText } from "./shim-logger.js";

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "shim-logger-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

async function logOnce(logFormat: LogFormat, isTty: boolean): Promise<{ stdout: string; file: string }> {
  const stream = new PassThrough();
  let stdout = "";
  stream.on("data", (c: Buffer) => (stdout += c.toString()));
  const { log, logFile } = await createLogger({ home, logLevel: "info", logFormat }, { stream, isTty });
  log.info({ taskId: "t-1", url: "https://user:secret@example.com/x?token=1" }, "task running");
  log.flush();
  await new Promise((resolve) => setTimeout(resolve, 50));
  logFile.close();
  return { stdout, file: await readFile(join(home, "shim.log"), "utf8") };
}

describe("the shim's log", () => {
  it("auto is text on a terminal and JSON to a pipe; text and json override it", () => {
    expect([logsAsText("auto", true), logsAsText("auto", false)]).toEqual([true, false]);
    expect([logsAsText("text", false), logsAsText("json", true)]).toEqual([true, false]);
  });

  it("text: one readable line per event with time, level, message and fields; shim.log stays JSON", async () => {
    const { stdout, file } = await logOnce("text", false);
    const lines = stdout.trimEnd().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}\] INFO: task running .*"taskId":"t-1"/,
    );
    expect(lines[0]).not.toContain("secret");
    expect(stdout).not.toContain("\u001b["); // no colours off a terminal
    expect(JSON.parse(file.trim())).toMatchObject({ level: 30, msg: "task running", taskId: "t-1" });
  });

  it("json: pino's line on stdout, the same as shim.log", async () => {
    const { stdout, file } = await logOnce("json", true);
    const line = JSON.parse(stdout.trim()) as Record<string, unknown>;
    expect(line).toMatchObject({ msg: "task running", taskId: "t-1", url: "https://example.com/x" });
    expect(stdout).toBe(file);
  });
});
