import type { Command } from "@commander-js/extra-typings";
import { addStatusCommand } from "./status-command.js";
import { addTaskCommands } from "./task-commands.js";

/*
 * The client commands, one module per group: status-command.ts, task-commands.ts (with
 * submit-command.ts), over what they share in client-common.ts and task-filter.ts.
 */

/**
 * Adds the client commands to the `taskshim` program: `status` and `tasks ls | get | submit |
 * terminate | rm | logs | watch`, all against `--shim URL`.
 */
export function addClientCommands(program: Command): void {
  addStatusCommand(program);
  const tasks = program.command("tasks").description("list, submit, follow and remove a shim's tasks");
  addTaskCommands(tasks);
}
