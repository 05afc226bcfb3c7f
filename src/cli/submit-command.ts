import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { text as readStream } from "node:stream/consumers";
import { Option, type Command } from "@commander-js/extra-typings";
import type { ShimTaskInfo } from "../control/shim-client.js";
import { errorMessage } from "../errors/error-message.js";
import { NETWORK_MODES } from "../tasks/task-fields.js";
import {
  CliError,
  collect,
  jsonOption,
  print,
  printJson,
  run,
  shimOption,
  tokenOption,
} from "./client-common.js";
import { durationFlag } from "../config/durations.js";
import { SubmitProgressView } from "./pull-progress-bar.js";
import { escapeControls, escapeControlsKeepingLines } from "./terminal-text.js";
import { buildSubmitBody, InvalidSubmitFlagError } from "./submit-body.js";
import { FollowTimeoutError, followStart } from "./task-follow.js";

async function readConfigFile(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = path === "-" ? await readStream(process.stdin) : await readFile(path, "utf8");
  } catch (error) {
    throw new CliError(`cannot read --file ${path}: ${errorMessage(error)}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new CliError(`--file ${path} is not valid JSON: ${errorMessage(error)}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new CliError(`--file ${path} must hold a JSON object (the POST /api/tasks body)`);
  }
  return value as Record<string, unknown>;
}

/** `running`, or terminated by the task itself with success: anything else is a failure. */
function succeeded(task: ShimTaskInfo): boolean {
  return task.status === "running" || task.termination_reason === "done_by_runner";
}

/** `taskshim tasks submit`: a task from --file and flags, followed until it runs. */
export function addSubmitCommand(tasks: Command): void {
  tasks
    .command("submit")
    .description(
      "submit a task from --file and/or flags, then follow it until it runs (pull progress included)",
    )
    .argument("[command...]", "the command to run instead of the image's (after --)")
    .option("-f, --file <path>", 'task config: the JSON body of POST /api/tasks ("-" reads stdin)')
    .option("--id <id>", "task id (default: a new UUID)")
    .option("--name <name>", "task name (default: from the image)")
    .option("--image <image>", "image to run")
    .option("--command <args...>", "the command and its arguments (or give them after --)")
    .option(
      "-e, --env <K=V>",
      "container environment variable (repeatable; K alone passes this shell's)",
      collect,
      [] as string[],
    )
    .option("--gpu <n>", "GPUs: a count, 0 for none, -1 for all")
    .option("--cpu <n>", "CPUs, fractions allowed (0 = all)")
    .option("--memory <size>", "memory limit, like 4GiB or 512MiB (0 = none)")
    .option("--shm <size>", "/dev/shm size, like 1GiB")
    .option("-u, --user <user>", "the container's user, name or uid[:gid] (default: root, as dstack-shim)")
    .option("--mount <host:container>", "bind mount a host dir (repeatable)", collect, [] as string[])
    .addOption(new Option("--network <mode>", "network mode").choices(NETWORK_MODES))
    .option("--registry-user <user>", "registry username")
    .addOption(
      new Option("--registry-password <password>", "registry password").env("TASKSHIM_REGISTRY_PASSWORD"),
    )
    .option("--privileged", "run the container privileged")
    .option("-d, --detach", "print the submitted task and return without following it")
    .option(
      "--timeout <duration>",
      "stop following after this long, like 30s or 5m (the task goes on; 0 = never)",
      durationFlag(),
      0,
    )
    .addOption(
      new Option("--poll-interval <duration>", "how often to poll, like 250ms")
        .argParser(durationFlag(10))
        .default(250)
        .hideHelp(),
    )
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (words, options) =>
      run(options, async (client) => {
        const file = options.file !== undefined ? await readConfigFile(options.file) : undefined;
        let body;
        try {
          body = buildSubmitBody(
            file,
            { ...options, command: options.command ?? (words.length > 0 ? words : undefined) },
            { newId: randomUUID, env: (name) => process.env[name] },
          );
        } catch (error) {
          if (error instanceof InvalidSubmitFlagError) throw new CliError(error.message);
          throw error;
        }
        const submitted = await client.submitTask(body, { adoptExisting: false });
        // With --json, stdout carries only the final JSON; progress goes to stderr.
        const progressOut = options.json ? process.stderr : process.stdout;
        if (options.detach) {
          if (options.json) printJson(submitted);
          else
            print(
              escapeControls(`submitted task ${submitted.id} (container ${submitted.container_name ?? "-"})`),
            );
          return;
        }
        progressOut.write(
          `${escapeControls(`submitted task ${submitted.id} (container ${submitted.container_name ?? "-"})`)}\n`,
        );
        const view = new SubmitProgressView(progressOut);
        let final: ShimTaskInfo | undefined;
        try {
          final = await followStart(client, submitted.id, (task) => view.update(task), {
            timeoutMs: options.timeout,
            pollMs: options.pollInterval,
          });
        } catch (error) {
          view.end(undefined);
          if (error instanceof FollowTimeoutError) throw new CliError(error.message);
          throw error;
        }
        view.end(final);
        if (options.json) printJson(final);
        else if (final.status === "running")
          print(escapeControls(`running: task ${final.id} in container ${final.container_name ?? "-"}`));
        else {
          print(escapeControls(`terminated: ${final.termination_reason}`));
          // Container output: shown line by line, with its controls escaped.
          if (final.termination_message)
            print(escapeControlsKeepingLines(final.termination_message).replace(/^/gm, "  "));
        }
        if (!succeeded(final)) {
          const code =
            final.exit_code === null || final.exit_code === undefined
              ? ""
              : ` (exit code ${final.exit_code})`;
          throw new CliError(`task ${final.id} failed: ${final.termination_reason}${code}`);
        }
      }),
    );
}
