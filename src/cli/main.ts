import { Command } from "@commander-js/extra-typings";
import { ConfigError, resolveShimConfig, SERVE_SETTINGS, type ServeFlags } from "../config/shim-config.js";
import { VERSION } from "../version.js";
import { startShim } from "./serve.js";

/** The path of this shim's own executable: the SEA binary, or the bundle run by node. */
function ownBinaryPath(): string {
  const script = process.argv[1];
  return script && /taskshim(\.cjs)?$/.test(script) ? script : process.execPath;
}

async function serve(flags: ServeFlags): Promise<void> {
  const config = resolveShimConfig(flags, process.env, { shimBinaryPath: ownBinaryPath() });
  const shim = await startShim(config);
  const onSignal = (): void => shim.interrupt();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  await shim.stopped;
  process.exit(0);
}

/** Builds the `taskshim` command line. */
export function buildCli(): Command {
  const program = new Command("taskshim")
    .description("A dstack-shim compatible host agent that runs tasks as Docker containers")
    .version(`taskshim version ${VERSION}`, "-v, --version", "print the version")
    .showHelpAfterError();
  const serveCommand = program.command("serve").description("run the shim against the local Docker Engine");
  for (const setting of Object.values(SERVE_SETTINGS)) {
    serveCommand.option(setting.flag, `${setting.help}${setting.help ? " " : ""}[env ${setting.env}]`);
  }
  serveCommand.action(async (options) => serve(options));
  return program;
}

/** Entry point: one clear line and a non-zero exit on any startup failure. */
export function main(argv: string[] = process.argv): void {
  buildCli()
    .parseAsync(argv)
    .catch((error: unknown) => {
      const message = error instanceof Error ? error.message : String(error);
      process.stderr.write(
        `taskshim: ${error instanceof ConfigError ? "configuration error: " : ""}${message}\n`,
      );
      process.exit(1);
    });
}
