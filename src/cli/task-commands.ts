import { Option, type Command } from "@commander-js/extra-typings";
import { ShimHttpError, type ShimTaskInfo } from "../control/shim-client.js";
import { isTerminationReason, TERMINATION_REASONS } from "../tasks/termination-reason.js";
import {
  CliError,
  collect,
  describeClientError,
  jsonOption,
  positiveInt,
  print,
  printJson,
  run,
  shimOption,
  tokenOption,
} from "./client-common.js";
import { durationFlag } from "../config/durations.js";
import { addSubmitCommand } from "./submit-command.js";
import { allTaskInfos, matchesFilter, parseTaskFilters } from "./task-filter.js";
import { resolveTask } from "./task-lookup.js";
import {
  followEvents,
  formatWatchEvent,
  waitTerminated,
  watchTasks,
  type WatchEvent,
} from "./task-follow.js";
import { formatTaskDetails, formatTaskTable, newestFirst } from "./task-views.js";
import { escapeControls } from "./terminal-text.js";

/** How often the client polls a task it waits for. */
const WAIT_POLL_MS = 250;

const ID_HELP = "task id, a unique prefix of it, or the task's name";
/** The longest grace a terminate may ask for (the shim's limit: a day). */
const MAX_GRACE_MS = 86_400_000;

/** `--reason`: dstack's reasons only (the shim would turn any other into terminated_by_server). */
function terminationReason(value: string): string {
  const reason = value.trim().toLowerCase();
  if (!isTerminationReason(reason)) {
    throw new CliError(
      `--reason: unknown reason ${JSON.stringify(value)}; one of: ${TERMINATION_REASONS.join(", ")}`,
    );
  }
  return reason;
}

/** `tasks wait`'s exit status: the task's exit code (0..255), 1 when it has none. */
export function waitExitStatus(task: ShimTaskInfo): number {
  const code = task.exit_code;
  return code === null || code === undefined ? 1 : code & 0xff;
}

/**
 * `taskshim tasks ls | get | submit | terminate | wait | rm | logs | watch`, in that order (the
 * order of `taskshim tasks --help`).
 */
export function addTaskCommands(tasks: Command): void {
  addListCommand(tasks);
  addGetCommand(tasks);
  addSubmitCommand(tasks);
  addTerminateCommand(tasks);
  addWaitCommand(tasks);
  addRemoveCommand(tasks);
  addLogsCommand(tasks);
  addWatchCommand(tasks);
}

/** `tasks ls`: the tasks, newest first, filtered. */
function addListCommand(tasks: Command): void {
  tasks
    .command("ls")
    .alias("list")
    .description("list the shim's tasks")
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .option("-q, --quiet", "print only the task ids, one a line")
    .option(
      "--filter <key=value>",
      "only tasks with status=STATUS or name=NAME (repeatable)",
      collect,
      [] as string[],
    )
    .action(async (options) =>
      run(options, async (client) => {
        const filter = parseTaskFilters(options.filter);
        const { infos } = await allTaskInfos(client, (status) =>
          filter.statuses.length === 0 ? true : filter.statuses.includes(status),
        );
        const shown = newestFirst(infos.filter((t) => matchesFilter(t, filter)));
        if (options.quiet) {
          if (shown.length > 0) print(shown.map((t) => escapeControls(t.id)).join("\n"));
        } else if (options.json) printJson(shown);
        else print(formatTaskTable(shown));
      }),
    );
}

/** `tasks get`: one task in detail. */
function addGetCommand(tasks: Command): void {
  tasks
    .command("get")
    .description("show one task: status, exit code, times, container, GPUs, ports, pull")
    .argument("<id>", ID_HELP)
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (id, options) =>
      run(options, async (client) => {
        const task = await resolveTask(client, id);
        if (options.json) printJson(task);
        else print(formatTaskDetails(task));
      }),
    );
}

/** `tasks terminate`: stop a task and wait until it is terminated. */
function addTerminateCommand(tasks: Command): void {
  tasks
    .command("terminate")
    .alias("stop")
    .description(
      "terminate a task: stop its container (SIGTERM, then SIGKILL after --timeout), release its resources, and wait until it is terminated",
    )
    .argument("<id>", ID_HELP)
    .option(
      "--reason <reason>",
      "termination reason recorded on the task (one of dstack's)",
      terminationReason,
      "terminated_by_user",
    )
    .option("--message <text>", "termination message", "")
    .option(
      "--timeout <duration>",
      "grace between SIGTERM and SIGKILL, like 10s or 2m (a bare number is seconds)",
      durationFlag(0, MAX_GRACE_MS),
      10_000,
    )
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (id, options) =>
      run(options, async (client) => {
        const task = await resolveTask(client, id);
        const grace = Math.ceil(options.timeout / 1000);
        await client.terminateTask(task.id, options.reason, options.message, grace);
        // The answer can come before the stop is over (a pull cancelled, a stop cut by a
        // restart): the command ends when the task is terminated.
        const final = await waitTerminated(client, task.id, { timeoutMs: 0, pollMs: WAIT_POLL_MS });
        if (options.json) printJson(final);
        else print(formatTaskDetails(final));
      }),
    );
}

/** `tasks wait`: block until tasks are terminated; exit with the last one's code. */
function addWaitCommand(tasks: Command): void {
  tasks
    .command("wait")
    .description(
      "block until the tasks are terminated, print each one's exit code, and exit with the last one's (1 when it has none)",
    )
    .argument("<id...>", ID_HELP)
    .option("--timeout <duration>", "give up after this long, like 10m (0 = never)", durationFlag(), 0)
    .addOption(shimOption())
    .addOption(tokenOption())
    .action(async (ids, options) => {
      let status = 0;
      await run(options, async (client) => {
        const deadline = options.timeout > 0 ? performance.now() + options.timeout : 0;
        for (const given of ids) {
          const task = await resolveTask(client, given);
          const final = await waitTerminated(client, task.id, {
            timeoutMs: deadline === 0 ? 0 : Math.max(1, Math.round(deadline - performance.now())),
            pollMs: WAIT_POLL_MS,
          });
          print(final.exit_code === null || final.exit_code === undefined ? "-" : String(final.exit_code));
          status = waitExitStatus(final);
        }
      });
      process.exitCode = status;
    });
}

/** `tasks rm`: remove a terminated task (terminating it first with --force). */
function addRemoveCommand(tasks: Command): void {
  tasks
    .command("rm")
    .alias("remove")
    .description("remove a terminated task: its container, its resources and its directory")
    .argument("<id>", ID_HELP)
    .option("-f, --force", "terminate the task first (no grace period) if it is not terminated yet")
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (id, options) =>
      run(options, async (client) => {
        const task = await resolveTask(client, id);
        if (options.force && task.status !== "terminated") {
          await client.terminateTask(task.id, "terminated_by_user", "removed with --force", 0);
          await waitTerminated(client, task.id, { timeoutMs: 0, pollMs: WAIT_POLL_MS });
        }
        await client.removeTask(task.id);
        if (options.json) printJson({ id: task.id, removed: true });
        else print(escapeControls(`removed task ${task.id}`));
      }),
    );
}

/** `tasks logs`: the last lines of a task's container output. */
function addLogsCommand(tasks: Command): void {
  tasks
    .command("logs")
    .description("print the last lines of a task's container output (stdout and stderr)")
    .argument("<id>", ID_HELP)
    .option("-n, --tail <lines>", "how many lines (1..10000)", positiveInt("--tail", 1, 10_000), 100)
    .addOption(shimOption())
    .addOption(tokenOption())
    .action(async (id, options) =>
      run(options, async (client) => {
        const task = await resolveTask(client, id);
        if (!task.container_id) {
          throw new CliError(
            `task ${task.id} has no container (${task.status}${task.termination_reason ? `: ${task.termination_reason}` : ""}), so no output; see taskshim tasks get ${task.id}`,
          );
        }
        process.stdout.write(await client.logs(task.id, options.tail));
      }),
    );
}

/** `tasks watch`: status changes as they happen (the event stream, or polling). */
function addWatchCommand(tasks: Command): void {
  tasks
    .command("watch")
    .description(
      "print task status changes as they happen (the shim's event stream; every status, however short), until Ctrl-C",
    )
    .option("--once", "print the current tasks and exit")
    .option("--timeout <duration>", "exit after this long, like 30s (0 = never)", durationFlag(), 0)
    .option(
      "--interval <duration>",
      "poll interval for a shim without the event stream (dstack-shim), like 1s",
      durationFlag(10),
      1_000,
    )
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(new Option("--json", "print one JSON object per event (NDJSON)"))
    .action(async (options) =>
      run(options, async (client) => {
        const emit = (event: WatchEvent): void =>
          print(options.json ? JSON.stringify(event) : formatWatchEvent(event));
        const onReachability = (reachable: boolean, error?: Error): void => {
          process.stderr.write(
            reachable
              ? "taskshim: shim reachable again\n"
              : `taskshim: ${escapeControls(describeClientError(error, options.shim))}; retrying\n`,
          );
        };
        const poll = (): Promise<void> =>
          watchTasks(client, emit, {
            intervalMs: options.interval,
            once: options.once === true,
            timeoutMs: options.timeout,
            onReachability,
          });
        if (options.once) return poll();
        try {
          await followEvents(client, emit, { timeoutMs: options.timeout, retryMs: 1_000, onReachability });
        } catch (error) {
          // dstack-shim (or an older taskshim) has no event stream: poll the task list instead.
          if (error instanceof ShimHttpError && (error.status === 404 || error.status === 405)) return poll();
          throw error;
        }
      }),
    );
}
