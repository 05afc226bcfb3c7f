import { describe, expect, it } from "vitest";
import { fitServeArgs, parseServeHelp } from "./serve-flags.js";

/** Lines of 1.0.0's `serve --help`, as commander printed it (wrapped at 80 columns). */
const HELP_1_0_0 = [
  "Usage: taskshim serve [options]",
  "",
  "run the shim against the local Docker Engine",
  "",
  "Options:",
  "  --shim-home <dir>               home dir (shim.log, runners/) [env",
  "                                  DSTACK_SHIM_HOME]",
  "  --shim-http-address <addr>      address to bind (default 127.0.0.1) [env",
  "                                  TASKSHIM_HTTP_ADDRESS]",
  "  --auth-token-file <file>        require `Authorization: Bearer <token>` (the",
  "                                  file's content) on every route but the",
  "                                  healthcheck [env TASKSHIM_AUTH_TOKEN_FILE]",
  "  --shim-http-port <port>         HTTP port (default 10998) [env",
  "                                  DSTACK_SHIM_HTTP_PORT]",
  "  --adopt-unowned [bool]          adopt labelled containers without owner label",
  "                                  and without task state (migrating from a",
  "                                  stateless dstack-shim) [env",
  "                                  TASKSHIM_ADOPT_UNOWNED]",
  "  -h, --help                      display help for command",
].join("\n");

describe("U17 serve flags fitted to a release's serve --help", () => {
  it("reads the flags and variables of 1.0.0's help, wrapped lines and all", () => {
    const help = parseServeHelp(HELP_1_0_0);
    expect([...help.flags]).toEqual([
      "--shim-home",
      "--shim-http-address",
      "--auth-token-file",
      "--shim-http-port",
      "--adopt-unowned",
      "--help",
    ]);
    expect(help.variables).toContain("DSTACK_SHIM_HOME");
    expect(help.variables).toContain("TASKSHIM_ADOPT_UNOWNED");
    expect(help.variables).not.toContain("TASKSHIM_LOG_FORMAT");
  });

  it("leaves out today's flags it lacks with their values, in every spelling, and keeps the rest", () => {
    const help = parseServeHelp(HELP_1_0_0);
    const fit = fitServeArgs(
      [
        "--log-format",
        "json",
        "--shim-home",
        "/h",
        "--engine-url=unix:///run/docker.sock",
        "--max-event-streams",
        "8",
        "--privileged",
        "--adopt-unowned",
        "true",
        "--shim-http-port=1234",
        "--not-a-flag-anywhere",
      ],
      help,
      { TASKSHIM_LOG_FORMAT: "json", DSTACK_SHIM_HOME: "/h" },
    );
    expect(fit.args).toEqual([
      "--shim-home",
      "/h",
      "--adopt-unowned",
      "true",
      "--shim-http-port=1234",
      "--not-a-flag-anywhere",
    ]);
    expect(fit.dropped).toEqual(["--log-format", "--engine-url", "--max-event-streams", "--privileged"]);
    expect(fit.ignoredVariables).toEqual(["TASKSHIM_LOG_FORMAT"]);
  });
});
