import { readFile } from "node:fs/promises";
import { Command, Option } from "@commander-js/extra-typings";
import {
  FENCE_DEFAULT_DEADLINE_MS,
  fence,
  FenceRequestError,
  type FenceReport,
  type FenceRequest,
} from "../control/fence.js";
import type { CliTarget, SshTarget } from "../docker/cli-removal.js";
import { BoundedCommandRunner } from "../exec/run-bounded.js";
import { isValidTaskId } from "../tasks/task-config.js";
import { cell, formatTable } from "./table.js";
import { escapeControls } from "./terminal-text.js";
import { errorMessage } from "../errors/error-message.js";

const DEFAULT_DEADLINE = `${FENCE_DEFAULT_DEADLINE_MS / 1_000}s`;

/** Exit status of `taskshim fence` for a command line it cannot use. */
export const FENCE_USAGE_EXIT = 2;

/** The command line cannot be used; nothing was done. */
export class FenceUsageError extends Error {
  override readonly name = "FenceUsageError";
}

/** `fence`'s flags as commander parses them. */
export interface FenceFlags {
  readonly shim?: string;
  readonly ssh?: string;
  readonly identity?: string;
  readonly sshOption: readonly string[];
  readonly local?: true;
  readonly all?: true;
  readonly task: readonly string[];
  readonly label: readonly string[];
  readonly deadline: string;
  readonly json?: true;
  readonly authTokenFile?: string;
}

/** `30s`, `500ms`, `2m`, or a bare number of seconds; more than 0. */
export function parseDeadline(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m)?$/.exec(text.trim());
  if (!match) throw new FenceUsageError(`invalid --deadline ${JSON.stringify(text)} (like 30s, 500ms or 2m)`);
  const value = Number(match[1]);
  const ms = match[2] === "ms" ? value : match[2] === "m" ? value * 60_000 : value * 1_000;
  if (!(ms >= 1) || ms > 3_600_000) {
    throw new FenceUsageError(`--deadline ${text} is out of range (1 ms to 1 h)`);
  }
  return Math.round(ms);
}

/** `[USER@]HOST[:PORT]`; an IPv6 host goes in brackets (`[::1]:2222`). */
export function parseSshTarget(text: string): Pick<SshTarget, "host" | "user" | "port"> {
  const match = /^(?:([^@\s]+)@)?(\[[^\]\s]+\]|[^:@\s[\]]+)(?::(\d+))?$/.exec(text);
  if (!match) throw new FenceUsageError(`invalid --ssh ${JSON.stringify(text)} (like user@host:22)`);
  const [, user, rawHost = "", rawPort] = match;
  const port = rawPort === undefined ? undefined : Number(rawPort);
  if (port !== undefined && (port < 1 || port > 65_535)) {
    throw new FenceUsageError(`invalid port in --ssh ${JSON.stringify(text)}`);
  }
  const host = rawHost.startsWith("[") ? rawHost.slice(1, -1) : rawHost;
  // A host starting with "-" would be read by ssh as an option.
  if (host.startsWith("-") || user?.startsWith("-")) {
    throw new FenceUsageError(`invalid --ssh ${JSON.stringify(text)}`);
  }
  return { host, ...(user === undefined ? {} : { user }), ...(port === undefined ? {} : { port }) };
}

/** The fence request for a command line, or `FenceUsageError`. */
export function fenceRequestOf(flags: FenceFlags, authToken?: string): FenceRequest {
  if (flags.ssh !== undefined && flags.local)
    throw new FenceUsageError("--ssh and --local exclude each other");
  if (flags.shim === undefined && flags.ssh === undefined && !flags.local) {
    throw new FenceUsageError("say where: --shim URL, --ssh [USER@]HOST[:PORT] or --local");
  }
  if (flags.ssh === undefined && (flags.identity !== undefined || flags.sshOption.length > 0)) {
    throw new FenceUsageError("--identity and --ssh-option need --ssh");
  }
  if (flags.all && flags.task.length > 0) throw new FenceUsageError("--all and --task exclude each other");
  if (!flags.all && flags.task.length === 0) {
    throw new FenceUsageError("say which tasks: --all, or --task ID (repeatable)");
  }
  for (const id of flags.task) {
    if (id.trim() === "") throw new FenceUsageError("--task needs a task id");
    // The submit's rule: a task id goes into the shim's URLs, where `..` or `/` name other routes.
    if (!isValidTaskId(id)) {
      throw new FenceUsageError(
        `invalid --task ${JSON.stringify(id)}: a task id is letters, digits, '_', '.', ':' or '-' (at most 128)`,
      );
    }
  }
  for (const label of flags.label) {
    if (!/^[^=\s]+=[^\s]*$/.test(label))
      throw new FenceUsageError(`invalid --label ${JSON.stringify(label)} (KEY=VALUE)`);
  }
  if (flags.shim !== undefined) {
    let url: URL;
    try {
      url = new URL(flags.shim);
    } catch {
      throw new FenceUsageError(`invalid --shim URL ${JSON.stringify(flags.shim)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new FenceUsageError(`invalid --shim URL ${JSON.stringify(flags.shim)}: use http:// or https://`);
    }
  }
  const deadlineMs = parseDeadline(flags.deadline);
  let cli: CliTarget | undefined;
  if (flags.local) cli = { kind: "local" };
  if (flags.ssh !== undefined) {
    cli = {
      kind: "ssh",
      ...parseSshTarget(flags.ssh),
      ...(flags.identity === undefined ? {} : { identityFile: flags.identity }),
      options: flags.sshOption,
    };
  }
  return {
    ...(flags.shim === undefined ? {} : { shimUrl: new URL(flags.shim).origin }),
    ...(authToken === undefined ? {} : { authToken }),
    ...(cli === undefined ? {} : { cli }),
    selection: flags.all ? { kind: "all" } : { kind: "tasks", ids: [...new Set(flags.task)] },
    deadlineMs,
    labels: flags.label,
  };
}

/** The one line naming a host-level failure, or null when there is none. */
export function hostErrorLine(report: FenceReport): string | null {
  // The detail may quote a shim's or a docker CLI's answer: nothing in it reaches the terminal raw.
  return report.error === null
    ? null
    : escapeControls(`${report.host}: ${report.error.reason}: ${report.error.detail}`);
}

/**
 * The table `taskshim fence` prints: container, task id, the path that decided, outcome, detail;
 * then the host-level failure, if any, and the summary.
 */
export function formatFenceReport(report: FenceReport): string {
  const rows = report.results.map((r) => [
    cell(r.container),
    cell(r.task_id),
    r.via,
    r.outcome,
    cell(
      r.reason === null
        ? null
        : `${r.reason}: ${typeof r.evidence.detail === "string" ? r.evidence.detail : ""}`,
      100,
    ),
  ]);
  const table = formatTable(["CONTAINER", "TASK ID", "VIA", "OUTCOME", "DETAIL"], rows);
  const hostLine = hostErrorLine(report);
  const summary = `${report.confirmed ? "confirmed" : "NOT confirmed"}: ${report.results.length} result(s) via ${report.via} on ${escapeControls(report.host)}`;
  return [table, ...(hostLine === null ? [] : [`host: ${hostLine}`]), summary].join("\n");
}

/** Registers `taskshim fence` on the program. */
export function addFenceCommand(program: Command): void {
  const collect = (value: string, previous: string[]): string[] => [...previous, value];
  program
    .command("fence")
    .description(
      "make sure a host's tasks are dead before a control plane runs them elsewhere (no split brain): " +
        "through the shim's API, or the docker CLI over SSH or locally; exit 0 only when every removal is confirmed",
    )
    .option(
      "--shim <url>",
      "ask this shim first: terminate (timeout 0), remove, confirm through its API; what it does not confirm goes to --ssh/--local",
    )
    .option(
      "--ssh <[user@]host[:port]>",
      "run the docker CLI on this host over ssh (with --shim: for what the shim did not confirm, and --all's listing)",
    )
    .option("--identity <file>", "ssh identity file (with --ssh)")
    .option(
      "--ssh-option <option>",
      "an extra ssh -o option, like StrictHostKeyChecking=yes (repeatable)",
      collect,
      [],
    )
    .option("--local", "run the local docker CLI")
    .option("--all", "every container with the label ai.dstack.shim.is-task=true")
    .option("--task <id>", "the container of this task (repeatable)", collect, [])
    .option("--label <key=value>", "only containers that also carry this label (repeatable)", collect, [])
    .option(
      "--deadline <duration>",
      "bound of each removal, listing and shim call (30s, 500ms, 2m)",
      DEFAULT_DEADLINE,
    )
    .addOption(
      new Option("--auth-token-file <path>", "file with the shim's bearer token").env(
        "TASKSHIM_AUTH_TOKEN_FILE",
      ),
    )
    .option("--json", "print one JSON object instead of a table")
    .exitOverride((error) => {
      // Help and version exit 0; every other command-line error is a usage error.
      process.exit(error.exitCode === 0 ? 0 : FENCE_USAGE_EXIT);
    })
    .action(async (flags) => {
      let request: FenceRequest;
      try {
        const token = flags.authTokenFile === undefined ? undefined : await readToken(flags.authTokenFile);
        request = fenceRequestOf(flags, token);
      } catch (error) {
        if (!(error instanceof FenceUsageError)) throw error;
        process.stderr.write(`taskshim: fence: ${error.message}\n`);
        process.exit(FENCE_USAGE_EXIT);
      }
      let result: FenceReport;
      try {
        result = await fence(new BoundedCommandRunner(), request);
      } catch (error) {
        if (!(error instanceof FenceRequestError)) throw error;
        process.stderr.write(`taskshim: fence: ${error.message}\n`);
        process.exit(FENCE_USAGE_EXIT);
      }
      // A host-level failure also goes to stderr: a script keeping only stderr still learns why.
      const hostLine = hostErrorLine(result);
      if (hostLine !== null) process.stderr.write(`taskshim: fence: NOT confirmed: ${hostLine}\n`);
      process.stdout.write(
        flags.json ? `${JSON.stringify(result, null, 2)}\n` : `${formatFenceReport(result)}\n`,
      );
      process.exit(result.confirmed ? 0 : 1);
    });
}

async function readToken(path: string): Promise<string> {
  let token: string;
  try {
    token = (await readFile(path, "utf8")).trim();
  } catch (error) {
    throw new FenceUsageError(`cannot read --auth-token-file: ${errorMessage(error)}`);
  }
  if (token === "") throw new FenceUsageError(`--auth-token-file ${path} is empty`);
  return token;
}
