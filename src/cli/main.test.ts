import { describe, expect, it } from "vitest";
import { ConfigError } from "../config/shim-config.js";
import { buildCli, describeFailure, EXIT_CONFIG } from "./main.js";

/** Parses argv with the real command line and returns how main() would end. */
async function outcome(args: string[], path: string[]) {
  const error = await buildCli()
    .parseAsync(["node", "taskshim", ...args])
    .then(() => undefined)
    .catch((e: unknown) => e);
  return describeFailure(error, path);
}

describe("CLI errors", () => {
  it("turns an unknown flag into one line with the command's --help, without the usage", async () => {
    expect(await outcome(["tasks", "ls", "--bogus"], ["tasks", "ls"])).toEqual({
      line: "taskshim: unknown option '--bogus' (see taskshim tasks ls --help)",
      code: 1,
    });
  });

  it("names the flag and the value of a bad duration", async () => {
    expect(await outcome(["tasks", "wait", "x", "--timeout", "abc"], ["tasks", "wait"])).toEqual({
      line: 'taskshim: --timeout: expected a duration like 10s, 500ms or 2m (a bare number is seconds), got "abc" (see taskshim tasks wait --help)',
      code: 1,
    });
  });

  it("makes a serve usage error or ConfigError a configuration error with EX_CONFIG", async () => {
    expect(await outcome(["serve", "--bogus"], ["serve"])).toEqual({
      line: "taskshim: configuration error: unknown option '--bogus' (see taskshim serve --help)",
      code: EXIT_CONFIG,
    });
    expect(describeFailure(new ConfigError('invalid log level "loud"'), ["serve"])).toEqual({
      line: 'taskshim: configuration error: invalid log level "loud"',
      code: 78,
    });
  });

  it("serves with no command (as dstack starts dstack-shim): a bad root flag or value is EX_CONFIG", async () => {
    expect(await outcome(["--bogus"], [])).toEqual({
      line: "taskshim: configuration error: unknown option '--bogus' (see taskshim --help)",
      code: EXIT_CONFIG,
    });
    expect(await outcome(["--privileged", "--shim-http-port", "abc"], [])).toEqual({
      line: 'taskshim: configuration error: DSTACK_SHIM_HTTP_PORT: invalid port "abc"',
      code: EXIT_CONFIG,
    });
  });

  it("takes every flag of dstack-shim's command line at the root, as at serve", () => {
    const program = buildCli();
    const serve = program.commands.find((c) => c.name() === "serve");
    const longs = (options: readonly { long?: string }[]) => options.map((o) => o.long).filter(Boolean);
    for (const flag of [
      "--shim-home",
      "--shim-binary-path",
      "--shim-http-port",
      "--shim-log-level",
      "--runner-download-url",
      "--runner-binary-path",
      "--runner-http-port",
      "--runner-ssh-port",
      "--runner-ssh-log-level",
      "--runner-log-level",
      "--dcgm-exporter-http-port",
      "--dcgm-exporter-interval",
      "--dcgm-address",
      "--pass-env",
      "--privileged",
      "--pjrt-device",
      "--service",
    ]) {
      expect(longs(program.options)).toContain(flag);
      expect(longs(serve?.options ?? [])).toContain(flag);
    }
  });

  it("never serves on a misspelt command: one line, exit 1", async () => {
    expect(await outcome(["sevre"], [])).toEqual({
      line: "taskshim: unknown command 'sevre' (see taskshim --help)",
      code: 1,
    });
    expect(await outcome(["--privileged", "--pjrt-device=TPU", "stauts"], [])).toEqual({
      line: "taskshim: unknown command 'stauts' (see taskshim --help)",
      code: 1,
    });
  });

  it("keeps any other error on one line", () => {
    expect(describeFailure(new Error("a\n  b"), ["tasks", "get"])).toEqual({
      line: "taskshim: a b",
      code: 1,
    });
  });
});
