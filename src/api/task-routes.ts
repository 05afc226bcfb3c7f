import type { Static } from "typebox";
import { DockerNotFoundError } from "../docker/docker-errors.js";
import { errorMessage } from "../errors/error-message.js";
import { TaskOperationError } from "../runner/task-runner.js";
import { parseTaskConfig } from "../tasks/task-config.js";
import { normalizeTerminationReason, type TerminationReason } from "../tasks/termination-reason.js";
import { LogsQuery, SubmitBody, TaskInfo, TaskList, TerminateBody } from "../wire/schemas.js";
import { taskInfo, taskInfoJson } from "../wire/task-answers.js";
import type { ApiDeps } from "./api-deps.js";
import type { EventStreams } from "./event-streams.js";
import { HttpError } from "./http-errors.js";
import type { ApiRoute } from "./openapi.js";
import { readBody, sendJson, sendText, taskIdParam as id } from "./replies.js";

const MAX_LOG_TAIL = 10_000;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f]/;

/**
 * The tasks: list, submit, get, the event stream of their status changes, logs, terminate and
 * remove. Reads are answered from memory; only the logs ask the engine.
 */
export function taskRoutes(deps: ApiDeps, eventStreams: EventStreams): ApiRoute[] {
  let taskList = { generation: -1, json: "" };
  return [
    {
      method: "GET",
      url: "/api/tasks",
      summary: "Every task's id and status",
      response: TaskList,
      handler: (_request, reply) => {
        // Serialized again only after a change: control planes poll this for every task.
        if (taskList.generation !== deps.store.generation) {
          const tasks = deps.store.list().map((t) => ({ id: t.id, status: t.status }));
          taskList = { generation: deps.store.generation, json: JSON.stringify({ tasks }) };
        }
        return sendJson(reply, taskList.json);
      },
    },
    {
      method: "POST",
      url: "/api/tasks",
      summary: "Submit a task (idempotent for the same id and config; 409 for a different config)",
      body: SubmitBody,
      response: TaskInfo,
      handler: async (request) => {
        const { config, auth } = parseTaskConfig(readBody(request));
        // Refused now rather than at container creation (`bind source path does not exist`).
        const missing =
          config.command || deps.store.get(config.id) ? undefined : deps.components.missingRunner();
        if (missing !== undefined) {
          throw new HttpError(
            400,
            `the runner binary ${missing} does not exist: install dstack-runner there (--runner-binary-path, --runner-download-url, POST /api/components/install), or give the task a command`,
          );
        }
        return taskInfo(await deps.runner.submit(config, auth));
      },
    },
    {
      method: "GET",
      url: "/api/tasks/:id",
      summary: "One task",
      response: TaskInfo,
      handler: (request, reply) => {
        const task = deps.store.get(id(request));
        return task ? sendJson(reply, taskInfoJson(task)) : sendText(reply, 404, "Not Found");
      },
    },
    {
      method: "GET",
      url: "/api/events",
      summary:
        "taskshim extension: task status changes as they happen, as newline-delimited JSON: first every task present, then each addition, status change and removal",
      handler: (_request, reply) => {
        // Beyond the cap a clear answer, and the connection is not kept: streams never take
        // the connections the rest of the API needs (event-streams.ts).
        if (!eventStreams.admit()) {
          const limit = eventStreams.limits.maxStreams;
          return sendText(
            reply.header("connection", "close").header("retry-after", "5"),
            503,
            `too many event streams: all ${limit} allowed are open (--max-event-streams); try again later`,
          );
        }
        // The stream writes to the response itself, with back-pressure and its own cut-offs.
        reply.hijack();
        eventStreams.serve(reply.raw);
        return reply;
      },
    },
    {
      method: "GET",
      url: "/api/tasks/:id/logs",
      summary:
        "taskshim extension: the last `tail` lines (default 100) of the container's output, at most its last 1 MiB (a longer line is cut at its start), as text",
      query: LogsQuery,
      handler: async (request, reply) => {
        const task = deps.store.mustGet(id(request));
        const raw = (request.query as { tail?: string }).tail ?? "100";
        const tail = Number(raw);
        if (!/^\d+$/.test(raw) || tail < 1 || tail > MAX_LOG_TAIL) {
          throw new HttpError(400, `tail must be an integer from 1 to ${MAX_LOG_TAIL}`);
        }
        const lines =
          task.containerId === undefined
            ? []
            : await deps.docker.containerLogTail(task.containerId, tail).catch((cause: unknown) => {
                // Removed (by a remove, or from outside): nothing left to read, and no fault of ours.
                if (cause instanceof DockerNotFoundError) {
                  throw new HttpError(410, `task ${task.id}: its container is gone`, { cause });
                }
                throw new TaskOperationError(`failed to read logs: ${errorMessage(cause)}`, { cause });
              });
        return reply
          .header("content-type", "text/plain; charset=utf-8")
          .send(lines.length > 0 ? `${lines.join("\n")}\n` : "");
      },
    },
    {
      method: "POST",
      url: "/api/tasks/:id/terminate",
      summary: "Terminate a task (cancel its pull or stop its container); the first reason wins",
      body: TerminateBody,
      response: TaskInfo,
      handler: async (request) => {
        const taskId = id(request);
        const { reason, message, timeout } = parseTerminate(readBody(request, TerminateBody));
        deps.store.mustGet(taskId);
        return taskInfo(await deps.runner.terminate(taskId, timeout, reason, message));
      },
    },
    {
      method: "POST",
      url: "/api/tasks/:id/remove",
      summary: "Remove a terminated task: its container (confirmed), resources and directory",
      handler: async (request, reply) => {
        await deps.runner.remove(id(request));
        return sendText(reply, 200, "");
      },
    },
  ];
}

function parseTerminate(b: Static<typeof TerminateBody>): {
  reason: TerminationReason;
  message: string;
  timeout: number;
} {
  const rawReason = b.termination_reason ?? "";
  const message = b.termination_message ?? "";
  if (CONTROL.test(rawReason)) {
    throw new HttpError(400, 'Request body contains an invalid value for the "termination_reason" field');
  }
  if (message.includes("\u0000")) {
    throw new HttpError(400, 'Request body contains an invalid value for the "termination_message" field');
  }
  // "" comes from the server's dangling-task cleanup; a terminated task still needs a valid reason.
  const reason = normalizeTerminationReason(rawReason, "terminated_by_server");
  const known = rawReason.trim().toLowerCase() === reason;
  return {
    reason,
    message: known || rawReason === "" ? message : `${rawReason}: ${message}`.trim(),
    timeout: b.timeout ?? 0,
  };
}
