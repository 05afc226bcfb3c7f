import { readFile } from "node:fs/promises";
import { Command, CommanderError } from "@commander-js/extra-typings";
import { formatUpgradeTable, succeeded, upgradeFleet } from "../control/upgrade.js";
import { ConfigError, EXIT_CONFIG, SERVE_SETTINGS } from "../config/shim-config.js";
import { VERSION } from "../version.js";
import { addClientCommands } from "./client-commands.js";
import { addCheckGpuCommand } from "./check-gpu.js";
import { addFenceCommand } from "./fence-command.js";
import { durationFlag } from "../config/durations.js";
import { runSupervisor, serve } from "../shim/commands.js";
import { REFUSE_AFTER_MS, SERVE_WITHIN_MS } from "../shim/supervise.js";
import { addVersionCommand } from "./version-command.js";
import { errorMessage } from "../errors/error-message.js";
import { escapeControls } from "./terminal-text.js";

/** Adds every serve flag (dstack-shim's and taskshim's own) to `command`. */
function addServeOptions<C extends Command>(command: C): C {
  for (const setting of Object.values(SERVE_SETTINGS)) {
    command.option(setting.flag, `${setting.help}${setting.help ? " " : ""}[env ${setting.env}]`);
  }
  return command;
}

/** Builds the `taskshim` command line. */
export function buildCli(): Command {
  const program = new Command("taskshim")
    .description(
      "A dstack-shim compatible host agent that runs tasks as Docker containers; with no command it serves, as `serve` does",
    )
    .version(`taskshim version ${VERSION}`, "-v, --version", "print the version")
    // Errors become one `taskshim:` line in main(); the usage is printed only for --help.
    // Both settings are inherited by every command added below.
    .exitOverride()
    .configureOutput({ outputError: () => undefined })
    .enablePositionalOptions();
  // dstack starts dstack-shim with no subcommand (a systemd unit's bare ExecStart, cloud-init's
  // `dstack-shim --privileged --pjrt-device=TPU` loop), configured by the environment: the
  // root command serves as `serve` does. A word left over is a misspelt subcommand, never a
  // serve (commander would call it "too many arguments").
  addServeOptions(program)
    .allowExcessArguments()
    .action(async (options, command) => {
      const word = command.args[0];
      if (word !== undefined) {
        throw new CommanderError(1, "commander.unknownCommand", `error: unknown command '${word}'`);
      }
      await serve(options);
    });
  addServeOptions(
    program.command("serve").description("run the shim against the local Docker Engine"),
  ).action(async (options) => serve(options));
  addVersionCommand(program);

  program
    .command("supervise")
    .description(
      "keep `taskshim serve` running without systemd: restart at once after a handoff (exit 0), with a backoff after a crash, never after a configuration error (exit 78)",
    )
    .option("--binary <path>", "the shim binary to run (default: this one); an install replaces it")
    .option(
      "--crash-delay <duration>",
      "first delay before a restart after a crash, doubled per crash",
      durationFlag(0, 3_600_000),
      3_000,
    )
    .option(
      "--max-crash-delay <duration>",
      "the longest delay between crash restarts",
      durationFlag(0, 86_400_000),
      60_000,
    )
    .option(
      "--stable-after <duration>",
      "a run this long resets the crash backoff",
      durationFlag(0, 86_400_000),
      60_000,
    )
    .option(
      "--handoff-delay <duration>",
      "delay before restarting after exit 0",
      durationFlag(0, 3_600_000),
      100,
    )
    .option(
      "--serve-within <duration>",
      "a new binary that has not served by then (or exits first) is replaced by the previous one",
      durationFlag(1_000, 3_600_000),
      SERVE_WITHIN_MS,
    )
    .option(
      "--refuse-after <duration>",
      "once no shim has served for this long, the held API socket answers 503 until one does",
      durationFlag(0, 3_600_000),
      REFUSE_AFTER_MS,
    )
    .argument("[serve-args...]", "arguments for `serve` (after --)")
    .passThroughOptions()
    .action(async (serveArgs, options) => runSupervisor(serveArgs, options));
  program
    .command("upgrade")
    .description("roll a new shim binary out to running shims: install, gate, shut down, verify")
    .option("--shim <url...>", "a shim to upgrade (repeatable)", [] as string[])
    .option("--shims <file>", "a file with one shim URL per line")
    .requiredOption("--url <binary-url>", "where the shims download the new binary (http, https or file)")
    .option("--sha256 <hex>", "expected sha256 of the binary")
    .option("--concurrency <n>", "shims upgraded at once", "4")
    .option("--json", "print the results as JSON")
    .action(async (options) => {
      const fromFile = options.shims
        ? (await readFile(options.shims, "utf8"))
            .split("\n")
            .map((line) => line.trim())
            .filter((line) => line !== "" && !line.startsWith("#"))
        : [];
      const shims = [...options.shim, ...fromFile];
      if (shims.length === 0) throw new Error("no shim given (--shim URL or --shims FILE)");
      const results = await upgradeFleet(shims, options.url, options.sha256, Number(options.concurrency));
      process.stdout.write(
        options.json ? `${JSON.stringify(results, null, 2)}\n` : `${formatUpgradeTable(results)}\n`,
      );
      process.exit(results.every(succeeded) ? 0 : 1);
    });
  addClientCommands(program);
  addFenceCommand(program);
  addCheckGpuCommand(program);
  return program;
}

export { EXIT_CONFIG };

/** The command words of argv (`tasks get`), for the `--help` hint of a usage error. */
function commandPath(program: Command, args: readonly string[]): string[] {
  const path: string[] = [];
  let command: Command = program;
  for (const word of args) {
    if (word.startsWith("-")) continue;
    const next = command.commands.find((c) => c.name() === word || c.aliases().includes(word));
    if (!next) break;
    path.push(next.name());
    command = next as Command;
  }
  return path;
}

/** The one line and exit status for an error that ended the command. */
export function describeFailure(
  error: unknown,
  path: readonly string[],
): { readonly line: string; readonly code: number } | { readonly line?: undefined; readonly code: number } {
  // No command word is the root command, which serves like `serve`.
  const serving = path.length === 0 || path[0] === "serve";
  if (error instanceof CommanderError) {
    // --help and --version end here with exit code 0; help shown for a missing subcommand, 1.
    if (error.code === "commander.helpDisplayed" || error.code === "commander.version") return { code: 0 };
    if (error.code === "commander.help") return { code: error.exitCode };
    // A misspelt command is not a bad serve flag: an error of its own, not EX_CONFIG.
    if (error.code === "commander.unknownCommand") {
      const message = error.message.replace(/^error: /, "").replace(/\s*\n\s*/g, " ");
      return { line: `taskshim: ${message} (see taskshim --help)`, code: 1 };
    }
    // commander's `option '--timeout <duration>' argument 'abc' is invalid. <why>` → `--timeout: <why>, got "abc"`.
    const invalid = /^error: option '(-[^ ,']+)[^']*' argument '(.*)' is invalid\. (.*)$/s.exec(
      error.message,
    );
    const message = invalid
      ? `${invalid[1]}: ${invalid[3]}, got ${JSON.stringify(invalid[2])}`
      : error.message.replace(/^error: /, "");
    const help = ["taskshim", ...path, "--help"].join(" ");
    return {
      line: `taskshim: ${serving ? "configuration error: " : ""}${message} (see ${help})`,
      code: serving ? EXIT_CONFIG : 1,
    };
  }
  // One line, whatever the error carries: scripts read stderr line by line. A shim's answer
  // quoted in it is the shim's word: its controls are shown escaped, never sent to the terminal.
  const message = escapeControls(
    errorMessage(error)
      .trim()
      .replace(/\s*\n\s*/g, " "),
  );
  if (error instanceof ConfigError)
    return { line: `taskshim: configuration error: ${message}`, code: EXIT_CONFIG };
  return { line: `taskshim: ${message}`, code: 1 };
}

/**
 * A reader that went away (`taskshim tasks watch | head -1`) ends the command quietly and
 * successfully, as it does for other Unix tools; without this, the EPIPE is a stack trace.
 */
function endQuietlyOnClosedPipe(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (error: NodeJS.ErrnoException) => {
      if (error.code === "EPIPE") process.exit(0);
      throw error;
    });
  }
}

/** Entry point: one clear line and a non-zero exit on any failure. */
export function main(argv: string[] = process.argv, program: Command = buildCli()): void {
  endQuietlyOnClosedPipe();
  let settled = false;
  const path = commandPath(program, argv.slice(2));
  // A client request whose socket went away without an error leaves nothing to wait for: Node
  // would exit 0 in silence, as if the command had succeeded. (`serve` ends by emptying its
  // event loop on purpose.)
  process.once("beforeExit", () => {
    if (settled || (path[0] !== "status" && path[0] !== "tasks")) return;
    process.stderr.write("taskshim: the command ended without an answer from the shim\n");
    process.exit(1);
  });
  program
    .parseAsync(argv)
    .then(() => (settled = true))
    .catch((error: unknown) => {
      settled = true;
      const { line, code } = describeFailure(error, path);
      if (line !== undefined) process.stderr.write(`${line}\n`);
      process.exit(code);
    });
}
