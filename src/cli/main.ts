import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { isSea } from "node:sea";
import { Command, CommanderError } from "@commander-js/extra-typings";
import { formatUpgradeTable, succeeded, upgradeFleet } from "../control/upgrade.js";
import { ConfigError, resolveShimConfig, SERVE_SETTINGS, type ServeFlags } from "../config/shim-config.js";
import { VERSION } from "../version.js";
import { addClientCommands } from "./client-commands.js";
import { addCheckGpuCommand } from "./check-gpu.js";
import { addFenceCommand } from "./fence.js";
import { loadGlibcMalloc, MALLOC_ARENAS } from "./glibc-malloc.js";
import { holdApiSocket, serveAddress, standInSpawn } from "./held-socket.js";
import { durationFlag } from "./durations.js";
import { EXIT_CONFIG, REFUSE_AFTER_MS, SERVE_WITHIN_MS, supervise } from "./supervise.js";
import { serveUnavailable, STANDIN_ENV } from "./unserved-standin.js";
import type { RunningShim } from "./serve.js";
import { StartInterruptedError } from "./start-interruption.js";
import { addVersionCommand } from "./version-command.js";
import { errorMessage } from "../errors/error-message.js";
import { escapeControls } from "./terminal-text.js";

/**
 * The path of this shim's own executable: the single binary, or the bundle node runs, whatever
 * its name (dstack installs it as `/usr/local/bin/dstack-shim`).
 */
function ownBinaryPath(): string {
  const script = process.argv[1];
  return isSea() || !script ? process.execPath : resolve(script);
}

/** Adds every serve flag (dstack-shim's and taskshim's own) to `command`. */
function addServeOptions<C extends Command>(command: C): C {
  for (const setting of Object.values(SERVE_SETTINGS)) {
    command.option(setting.flag, `${setting.help}${setting.help ? " " : ""}[env ${setting.env}]`);
  }
  return command;
}

async function serve(flags: ServeFlags): Promise<void> {
  // The signal handlers before anything else: a SIGTERM while the shim still starts (a restore
  // held by a slow engine or disk) is a clean stop (home lock released, exit 0), never Node's
  // default handler's kill. Once it serves, a signal is the same bounded shutdown as
  // POST /api/shutdown; a second one skips the grace.
  const start = new AbortController();
  let shim: RunningShim | undefined;
  const onSignal = (signal?: unknown): void => {
    if (shim !== undefined) shim.shutdown(false);
    else if (!start.signal.aborted) {
      start.abort(new StartInterruptedError(typeof signal === "string" ? signal : "disconnect"));
    }
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  // Under `taskshim supervise` (an IPC channel to it): a supervisor that is gone (killed) leaves
  // this shim an orphan on the API's port, which the next supervisor could never bind. It shuts
  // down as on SIGTERM instead; the next supervisor waits for the port (held-socket.ts).
  if (process.channel !== undefined) process.once("disconnect", onSignal);
  // The arena limit only holds for threads that have not allocated yet.
  const malloc = loadGlibcMalloc();
  malloc?.limitArenas(MALLOC_ARENAS);
  const config = resolveShimConfig(flags, process.env, { shimBinaryPath: ownBinaryPath() });
  // Loaded on demand: the server's dependencies (fastify, dockerode, pino, prom-client) would
  // otherwise slow every client command down.
  const { startShim } = await import("./serve.js");
  try {
    shim = await startShim(config, malloc, start.signal);
  } catch (error) {
    // Stopped by a signal before it served: logged by the start, the home lock released.
    if (error instanceof StartInterruptedError) process.exit(0);
    throw error;
  }
  // A signal in the moment between the last check of the start and its return.
  if (start.signal.aborted) shim.shutdown(false);
  await shim.stopped;
  // Ends what the bound left behind too (a read stuck in the kernel, a step that ignored its signal).
  process.exit(0);
}

/** Where the supervised shims serve, when the serve flags say (else the healthcheck is not asked). */
function address(serveArgs: readonly string[]): { address?: { host: string; port: number } } {
  try {
    return { address: serveAddress(serveArgs, process.env) };
  } catch {
    return {};
  }
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
    .action(async (serveArgs, options) => {
      // The inner supervisor's stand-in: answer 503 on the held socket until told to stop.
      if (process.env[STANDIN_ENV] === "1") {
        await serveUnavailable(3);
        process.exit(0);
      }
      // A SIGTERM while waiting for the port (an earlier shim still shutting down) ends at once.
      const waiting = new AbortController();
      const stopWaiting = (): void => waiting.abort();
      process.once("SIGTERM", stopWaiting);
      process.once("SIGINT", stopWaiting);
      const holding = await holdApiSocket(serveArgs, process.env, {
        signal: waiting.signal,
        onWait: (why, waitMs) =>
          process.stderr.write(
            `${JSON.stringify({ time: new Date().toISOString(), supervisor: true, msg: "the API's port is in use; waiting for it (an earlier shim may still be shutting down)", why, waitMs })}\n`,
          ),
      });
      process.off("SIGTERM", stopWaiting);
      process.off("SIGINT", stopWaiting);
      if (holding.kind === "stopped") process.exit(0);
      if (holding.kind === "done") process.exit(holding.exitCode);
      const code = await supervise({
        binary: options.binary ?? ownBinaryPath(),
        serveArgs,
        crashDelayMs: options.crashDelay,
        maxCrashDelayMs: Math.max(options.maxCrashDelay, options.crashDelay),
        stableAfterMs: options.stableAfter,
        handoffDelayMs: options.handoffDelay,
        serveWithinMs: options.serveWithin,
        refuseAfterMs: options.refuseAfter,
        ...address(serveArgs),
        standIn: standInSpawn,
        heldSocket: holding.kind === "hold",
        watchOuter: holding.kind === "hold",
        ...(holding.kind === "none" ? { notHolding: holding.why } : {}),
      });
      process.exit(code);
    });
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
export function main(argv: string[] = process.argv): void {
  endQuietlyOnClosedPipe();
  const program = buildCli();
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
