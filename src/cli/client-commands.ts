import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { text as readStream } from "node:stream/consumers";
import { Option, type Command } from "@commander-js/extra-typings";
import pLimit from "p-limit";
import {
  ShimClient,
  ShimHttpError,
  ShimProtocolError,
  ShimUnreachableError,
  type ShimTaskInfo,
} from "../control/shim-client.js";
import { TASK_STATUSES, type TaskStatus } from "../tasks/task-status.js";
import { isTerminationReason, TERMINATION_REASONS } from "../tasks/termination-reason.js";
import { durationFlag } from "./durations.js";
import { SubmitProgressView } from "./pull-progress-bar.js";
import { buildSubmitBody, InvalidSubmitFlagError } from "./submit-body.js";
import { resolveTask, TaskLookupError } from "./task-lookup.js";
import {
  FollowTimeoutError,
  followStart,
  followEvents,
  formatWatchEvent,
  waitTerminated,
  watchTasks,
  type WatchEvent,
} from "./task-follow.js";
import {
  countByStatus,
  formatStatusReport,
  formatTaskDetails,
  formatTaskTable,
  newestFirst,
  parseQuarantined,
  type ShimStatusReport,
} from "./task-views.js";
import { errorMessage } from "../errors/error-message.js";

/** Where the client commands look for a shim unless told otherwise (dstack-shim's default port). */
export const DEFAULT_SHIM_URL = "http://127.0.0.1:10998";

/** A client command failed; the message is the one line the operator sees after `taskshim: `. */
export class CliError extends Error {
  override readonly name = "CliError";
}

interface ConnectOptions {
  readonly shim: string;
  readonly authTokenFile?: string | undefined;
}

const shimOption = () =>
  new Option("--shim <url>", "the shim's API").env("TASKSHIM_URL").default(DEFAULT_SHIM_URL);
const tokenOption = () =>
  new Option(
    "--auth-token-file <path>",
    "file holding the shim's bearer token (shims started with --auth-token-file)",
  ).env("TASKSHIM_AUTH_TOKEN_FILE");
const jsonOption = () => new Option("--json", "print JSON (for scripts) instead of a table");

/** A client for `--shim`, with the bearer token from `--auth-token-file` if given. */
async function connect(options: ConnectOptions): Promise<ShimClient> {
  let url: URL;
  try {
    url = new URL(options.shim);
  } catch {
    throw new CliError(`invalid --shim URL ${JSON.stringify(options.shim)} (like ${DEFAULT_SHIM_URL})`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new CliError(`invalid --shim URL ${JSON.stringify(options.shim)}: use http:// or https://`);
  }
  let authToken: string | undefined;
  if (options.authTokenFile !== undefined) {
    try {
      authToken = (await readFile(options.authTokenFile, "utf8")).trim();
    } catch (error) {
      throw new CliError(`cannot read --auth-token-file: ${errorMessage(error)}`);
    }
    if (authToken === "") throw new CliError(`--auth-token-file ${options.authTokenFile} is empty`);
  }
  return new ShimClient(url.origin, 9_000, authToken === undefined ? {} : { authToken });
}

/** The task id of a `/api/tasks/{id}…` path, or undefined. */
function taskIdOfPath(path: string): string | undefined {
  const match = /^\/api\/tasks\/([^/?]+)/.exec(path);
  return match?.[1] === undefined ? undefined : decodeURIComponent(match[1]);
}

/** One line for an error of the client side; shim bodies end with a newline, removed here. */
export function describeClientError(error: unknown, shim: string): string {
  if (error instanceof ShimHttpError) {
    const id = taskIdOfPath(error.path);
    // The two answers an operator meets most, with what to do about them.
    if (id !== undefined && error.status === 404) return `no such task: ${id} (see taskshim tasks ls)`;
    if (id !== undefined && error.status === 409 && error.path.endsWith("/remove")) {
      return `task ${id} is not terminated: terminate it first (taskshim tasks terminate ${id}) or use taskshim tasks rm --force ${id}`;
    }
    const body = error.body.trim().replace(/\s*\n\s*/g, " ");
    const hint = error.status === 401 ? " (this shim needs a token: --auth-token-file FILE)" : "";
    return `${error.method} ${error.path}: HTTP ${error.status}${body ? `: ${body}` : ""}${hint}`;
  }
  if (error instanceof TaskLookupError || error instanceof FollowTimeoutError) return error.message;
  if (error instanceof ShimUnreachableError) {
    return `cannot reach the shim at ${shim}: ${error.message.replace(/^\S+: /, "")} (is it running? see --shim)`;
  }
  if (error instanceof ShimProtocolError)
    return `unexpected answer from the shim at ${shim}: ${error.message}`;
  return errorMessage(error);
}

/** Runs a command body, turning every failure into one `CliError` line. */
async function run(options: ConnectOptions, body: (client: ShimClient) => Promise<void>): Promise<void> {
  const client = await connect(options);
  try {
    await body(client);
  } catch (error) {
    if (error instanceof CliError) throw error;
    throw new CliError(describeClientError(error, options.shim), { cause: error });
  }
}

function print(text: string): void {
  process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
}

function printJson(value: unknown): void {
  print(JSON.stringify(value, null, 2));
}

function positiveInt(flag: string, min = 1, max = Number.MAX_SAFE_INTEGER) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || n < min || n > max) {
      throw new CliError(`${flag}: expected an integer from ${min} to ${max}, got ${JSON.stringify(value)}`);
    }
    return n;
  };
}

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

/** `--filter status=running` (repeatable; statuses of one filter are alternatives). */
export interface TaskFilter {
  readonly statuses: readonly TaskStatus[];
  readonly names: readonly string[];
}

/** Parses `--filter KEY=VALUE` entries: `status=<status>` and `name=<name>`. */
export function parseTaskFilters(entries: readonly string[]): TaskFilter {
  const statuses: TaskStatus[] = [];
  const names: string[] = [];
  for (const entry of entries) {
    const eq = entry.indexOf("=");
    const key = eq === -1 ? entry : entry.slice(0, eq);
    const value = eq === -1 ? "" : entry.slice(eq + 1);
    if (key === "status") {
      if (!(TASK_STATUSES as readonly string[]).includes(value)) {
        throw new CliError(
          `--filter status: expected one of ${TASK_STATUSES.join(", ")}, got ${JSON.stringify(value)}`,
        );
      }
      statuses.push(value as TaskStatus);
    } else if (key === "name" && value !== "") {
      names.push(value);
    } else {
      throw new CliError(`--filter: expected status=STATUS or name=NAME, got ${JSON.stringify(entry)}`);
    }
  }
  return { statuses, names };
}

/** Whether a task passes every filter key given (values of one key are alternatives). */
export function matchesFilter(task: ShimTaskInfo, filter: TaskFilter): boolean {
  return (
    (filter.statuses.length === 0 || filter.statuses.includes(task.status)) &&
    (filter.names.length === 0 || filter.names.includes(task.name ?? ""))
  );
}

/** `tasks wait`'s exit status: the task's exit code (0..255), 1 when it has none. */
export function waitExitStatus(task: ShimTaskInfo): number {
  const code = task.exit_code;
  return code === null || code === undefined ? 1 : code & 0xff;
}

/** How often the client polls a task it waits for. */
const WAIT_POLL_MS = 250;

const collect = (value: string, previous: string[]): string[] => [...previous, value];

const ID_HELP = "task id, a unique prefix of it, or the task's name";
/** The longest grace a terminate may ask for (the shim's limit: a day). */
const MAX_GRACE_MS = 86_400_000;

/** Every task's full info; tasks removed between the list and the read are left out. */
async function allTaskInfos(client: ShimClient, filter: (status: TaskStatus) => boolean = () => true) {
  const list = (await client.listTasks()).filter((t) => filter(t.status));
  const infos = await pLimit(8).map(list, async (t) => {
    try {
      return await client.getTask(t.id);
    } catch (error) {
      if (error instanceof ShimHttpError && error.status === 404) return undefined;
      throw error;
    }
  });
  return { list, infos: infos.filter((t): t is ShimTaskInfo => t !== undefined) };
}

async function statusReport(client: ShimClient): Promise<ShimStatusReport> {
  const health = await client.healthcheck();
  // Older shims lack some endpoints (404): those parts are reported as not supported.
  const optional = <T>(promise: Promise<T>): Promise<T | undefined> =>
    promise.catch((error: unknown) => {
      if (error instanceof ShimHttpError && (error.status === 404 || error.status === 405)) return undefined;
      throw error;
    });
  const [info, components, live, metrics] = await Promise.all([
    optional(client.instanceInfo()),
    optional(client.getComponents()),
    allTaskInfos(client, (status) => status !== "terminated"),
    optional(client.metrics()),
  ]);
  const all = await client.listTasks();
  const gpusInUse = new Set(live.infos.flatMap((t) => t.gpus_ids ?? []));
  return {
    shim: client.baseUrl,
    service: health.service,
    version: health.version,
    implementation: health.implementation ?? null,
    engine: health.engine ?? null,
    ...(health.storage ? { storage: health.storage } : {}),
    ...(health.lifecycle ? { lifecycle: health.lifecycle } : {}),
    gpu: {
      vendor: info?.gpu_vendor ?? null,
      driver_version: info?.gpu_driver_version ?? null,
      in_use: gpusInUse.size,
    },
    components: components ?? null,
    tasks: { total: all.length, by_status: countByStatus(all) },
    quarantined_state_files: (metrics !== undefined ? parseQuarantined(metrics) : undefined) ?? null,
  };
}

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

function addStatusCommand(program: Command): void {
  program
    .command("status")
    .description("show a shim: version, Docker Engine health, GPUs, components, task counts by status")
    .addOption(shimOption())
    .addOption(tokenOption())
    .addOption(jsonOption())
    .action(async (options) =>
      run(options, async (client) => {
        const report = await statusReport(client);
        if (options.json) printJson(report);
        else print(formatStatusReport(report));
      }),
    );
}

function addTaskCommands(tasks: Command): void {
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
          if (shown.length > 0) print(shown.map((t) => t.id).join("\n"));
        } else if (options.json) printJson(shown);
        else print(formatTaskTable(shown));
      }),
    );

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
    .addOption(new Option("--network <mode>", "network mode").choices(["host", "bridge"] as const))
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
          else print(`submitted task ${submitted.id} (container ${submitted.container_name ?? "-"})`);
          return;
        }
        progressOut.write(`submitted task ${submitted.id} (container ${submitted.container_name ?? "-"})\n`);
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
          print(`running: task ${final.id} in container ${final.container_name ?? "-"}`);
        else {
          print(`terminated: ${final.termination_reason}`);
          if (final.termination_message) print(final.termination_message.replace(/^/gm, "  "));
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
        const deadline = options.timeout > 0 ? Date.now() + options.timeout : 0;
        for (const given of ids) {
          const task = await resolveTask(client, given);
          const final = await waitTerminated(client, task.id, {
            timeoutMs: deadline === 0 ? 0 : Math.max(1, deadline - Date.now()),
            pollMs: WAIT_POLL_MS,
          });
          print(final.exit_code === null || final.exit_code === undefined ? "-" : String(final.exit_code));
          status = waitExitStatus(final);
        }
      });
      process.exitCode = status;
    });

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
        else print(`removed task ${task.id}`);
      }),
    );

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
              : `taskshim: ${describeClientError(error, options.shim)}; retrying\n`,
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

/**
 * Adds the client commands to the `taskshim` program: `status` and `tasks ls | get | submit |
 * terminate | rm | logs | watch`, all against `--shim URL`.
 */
export function addClientCommands(program: Command): void {
  addStatusCommand(program);
  const tasks = program.command("tasks").description("list, submit, follow and remove a shim's tasks");
  addTaskCommands(tasks);
}
