import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { taskPath, UnaddressableTaskIdError } from "../control/shim-client.js";
import type { FenceReport } from "../control/fence.js";
import { thrown } from "../testing/thrown.js";
import { formatFenceReport, hostErrorLine } from "./fence-command.js";
import { buildCli, describeFailure } from "./main.js";
import { escapeControls, escapeControlsKeepingLines } from "./terminal-text.js";

/** Every character a human view must not print raw: C0, DEL, C1, bidi overrides and isolates. */
// eslint-disable-next-line no-control-regex
const UNSAFE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/;

const HOSTILE = {
  id: "t1\u202eexe.gnp",
  name: "train\u2066\u2069\u009b31m",
  image_name: "img\u001b]0;pwned\u0007:latest",
  termination_message: "boom\u0085\u202a\nsecond\u2067 line\r",
};

/** A task as a shim answers it. */
const info = (id: string, over: Record<string, unknown> = {}) => ({
  id,
  status: "terminated",
  termination_reason: "container_exited_with_error",
  termination_message: "",
  exit_code: 3,
  created_at: "2026-01-01T10:00:00.000Z",
  finished_at: "2026-01-01T10:03:00.000Z",
  ...over,
});

/** A fake shim: scripted answers per `METHOD raw-url`, every raw request URL recorded. */
class FakeShim {
  readonly urls: string[] = [];
  readonly answers = new Map<string, { status: number; body: unknown }>();
  private server: Server | undefined;

  async start(): Promise<string> {
    this.server = createServer((req, res) => void this.answer(req, res));
    await new Promise<void>((resolve) => this.server?.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.server?.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()));
  }

  private async answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    for await (const _ of req) void _;
    const key = `${req.method} ${req.url}`;
    this.urls.push(key);
    const answer = this.answers.get(key) ?? { status: 404, body: "not found\n" };
    const text = typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body);
    res.writeHead(answer.status, {
      "content-type": typeof answer.body === "string" ? "text/plain" : "application/json",
    });
    res.end(text);
  }
}

let shim: FakeShim;
let url: string;
let out: string[];

beforeEach(async () => {
  shim = new FakeShim();
  url = await shim.start();
  out = [];
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
    out.push(String(chunk));
    return true;
  });
});
afterEach(async () => {
  vi.restoreAllMocks();
  await shim.stop();
});

/** Runs the real command line; what it printed, and the one error line main() would print. */
async function cli(...args: string[]): Promise<{ stdout: string; line: string | undefined }> {
  const error = await buildCli()
    .parseAsync(["node", "taskshim", ...args, "--shim", url])
    .then(() => undefined)
    .catch((e: unknown) => e);
  return { stdout: out.join(""), line: error === undefined ? undefined : describeFailure(error, args).line };
}

describe("409 answers of the shim", () => {
  it("tasks rm shows the shim's own sentence, with what to do", async () => {
    shim.answers.set("GET /api/tasks", { status: 200, body: { tasks: [{ id: "t1", status: "running" }] } });
    shim.answers.set("GET /api/tasks/t1", { status: 200, body: info("t1", { status: "running" }) });
    shim.answers.set("POST /api/tasks/t1/remove", {
      status: 409,
      body: "request error: cannot remove task t1 with running status\n",
    });
    expect((await cli("tasks", "rm", "t1")).line).toBe(
      "taskshim: request error: cannot remove task t1 with running status" +
        " (terminate it first: taskshim tasks terminate t1, or taskshim tasks rm --force t1)",
    );
  });

  it("tasks submit shows the shim's conflict as it is", async () => {
    shim.answers.set("POST /api/tasks", {
      status: 409,
      body: "request error: task t1 exists with a different config\n",
    });
    const { line } = await cli("tasks", "submit", "--id", "t1", "--image", "busybox", "-d");
    expect(line).toBe("taskshim: request error: task t1 exists with a different config");
  });

  it("tasks terminate shows the shim's conflict as it is", async () => {
    shim.answers.set("GET /api/tasks", { status: 200, body: { tasks: [{ id: "t1", status: "running" }] } });
    shim.answers.set("GET /api/tasks/t1", { status: 200, body: info("t1", { status: "running" }) });
    shim.answers.set("POST /api/tasks/t1/terminate", {
      status: 409,
      body: "request error: task t1 is being removed\n",
    });
    const { line } = await cli("tasks", "terminate", "t1");
    expect(line).toBe("taskshim: request error: task t1 is being removed");
  });
});

describe("control and bidi characters in human views", () => {
  it("the one escape: C0, DEL, C1, bidi overrides and isolates as \\uXXXX; newlines kept where asked", () => {
    expect(escapeControls("a\u202eb")).toBe("a\\u202eb");
    expect(escapeControls("\u0000\u0007\u001b\u007f\u0080\u009b\u009f")).toBe(
      "\\u0000\\u0007\\u001b\\u007f\\u0080\\u009b\\u009f",
    );
    expect(escapeControls("\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069")).toBe(
      "\\u202a\\u202b\\u202c\\u202d\\u2066\\u2067\\u2068\\u2069",
    );
    expect(escapeControls("x\ny")).toBe("x\\u000ay");
    expect(escapeControlsKeepingLines("x\u202e\ny\r")).toBe("x\\u202e\ny\\u000d");
    expect(escapeControls("plain ascii, ü, 漢字, emoji 🚀")).toBe("plain ascii, ü, 漢字, emoji 🚀");
  });

  it("tasks ls and tasks get print hostile names, ids, images and messages escaped", async () => {
    const hostile = info(HOSTILE.id, HOSTILE);
    const path = `/api/tasks/${encodeURIComponent(HOSTILE.id)}`;
    shim.answers.set("GET /api/tasks", {
      status: 200,
      body: { tasks: [{ id: HOSTILE.id, status: "terminated" }] },
    });
    shim.answers.set(`GET ${path}`, { status: 200, body: hostile });

    const ls = await cli("tasks", "ls");
    expect(ls.line).toBeUndefined();
    expect(ls.stdout).toContain("t1\\u202eexe.gnp");
    expect(ls.stdout).toContain("train\\u2066\\u2069\\u009b31m");
    expect(ls.stdout).toContain("img\\u001b]0;pwned\\u0007:latest");
    expect(ls.stdout).not.toMatch(UNSAFE);

    out.length = 0;
    const get = await cli("tasks", "get", HOSTILE.id);
    expect(get.line).toBeUndefined();
    expect(get.stdout).toContain("boom\\u0085\\u202a\n");
    expect(get.stdout).toContain("second\\u2067 line\\u000d");
    expect(get.stdout).not.toMatch(UNSAFE);

    out.length = 0;
    const quiet = await cli("tasks", "ls", "-q");
    expect(quiet.stdout).toBe("t1\\u202eexe.gnp\n");
  });

  it("taskshim status prints the shim's words escaped", async () => {
    shim.answers.set("GET /api/healthcheck", {
      status: 200,
      body: {
        service: "dstack-shim",
        version: "0.19.1\u202e",
        engine: { status: "down", since: "2026-01-01T10:00:00.000Z", error: "dial\u009b2J unix" },
      },
    });
    shim.answers.set("GET /api/tasks", { status: 200, body: { tasks: [] } });
    const { stdout, line } = await cli("status");
    expect(line).toBeUndefined();
    expect(stdout).toContain("0.19.1\\u202e");
    expect(stdout).toContain("dial\\u009b2J unix");
    expect(stdout).not.toMatch(UNSAFE);
  });

  it("the fence table and its host line print escaped", () => {
    const report = {
      host: "gpu-7\u202e",
      via: "api",
      confirmed: false,
      error: { reason: "not_a_shim", detail: "answered \u001b[2J\u2066" },
      results: [
        {
          container: "c\u009bx",
          task_id: "t\u202e1",
          outcome: "unconfirmed",
          reason: "shim",
          via: "api",
          evidence: { detail: "HTTP 500: \u0085boom" },
        },
      ],
    } as unknown as FenceReport;
    const text = formatFenceReport(report);
    expect(text).toContain("c\\u009bx");
    expect(text).toContain("t\\u202e1");
    expect(text).toContain("\\u0085boom");
    expect(text).toContain("gpu-7\\u202e");
    expect(text).not.toMatch(UNSAFE);
    expect(hostErrorLine(report)).toBe("gpu-7\\u202e: not_a_shim: answered \\u001b[2J\\u2066");
  });

  it("an error line quoting the shim is escaped", async () => {
    shim.answers.set("POST /api/tasks", { status: 409, body: "request error: \u202eevil\u0007\n" });
    const { line } = await cli("tasks", "submit", "--id", "t1", "--image", "busybox", "-d");
    expect(line).toBe("taskshim: request error: \\u202eevil\\u0007");
  });
});

describe("task ids in request paths", () => {
  const ID = "a/b?c#d%e";
  const ENCODED = "a%2Fb%3Fc%23d%25e";

  it("are percent-encoded whole: get, terminate, remove and logs reach the task's own routes", async () => {
    shim.answers.set("GET /api/tasks", { status: 200, body: { tasks: [{ id: ID, status: "terminated" }] } });
    shim.answers.set(`GET /api/tasks/${ENCODED}`, {
      status: 200,
      body: info(ID, { container_id: "c1" }),
    });
    shim.answers.set(`POST /api/tasks/${ENCODED}/terminate`, {
      status: 200,
      body: info(ID),
    });
    shim.answers.set(`POST /api/tasks/${ENCODED}/remove`, { status: 200, body: "" });
    shim.answers.set(`GET /api/tasks/${ENCODED}/logs?tail=5`, { status: 200, body: "last line\n" });

    expect((await cli("tasks", "get", ID)).line).toBeUndefined();
    expect((await cli("tasks", "logs", ID, "--tail", "5")).line).toBeUndefined();
    expect((await cli("tasks", "terminate", ID, "--timeout", "0")).line).toBeUndefined();
    expect((await cli("tasks", "rm", ID)).line).toBeUndefined();
    const taskRoutes = shim.urls.filter((u) => u !== "GET /api/tasks");
    expect(new Set(taskRoutes)).toEqual(
      new Set([
        `GET /api/tasks/${ENCODED}`,
        `GET /api/tasks/${ENCODED}/logs?tail=5`,
        `POST /api/tasks/${ENCODED}/terminate`,
        `POST /api/tasks/${ENCODED}/remove`,
      ]),
    );
  });

  it("an id a URL would resolve away (`..`, `.`, empty) is never sent: no request reaches another route", async () => {
    for (const id of ["..", ".", ""])
      expect(thrown(() => taskPath(id))).toBeInstanceOf(UnaddressableTaskIdError);
    expect(taskPath("%2e%2e", "/remove")).toBe("/api/tasks/%252e%252e/remove");

    shim.answers.set("GET /api/tasks", { status: 200, body: { tasks: [{ id: "..", status: "running" }] } });
    const ls = await cli("tasks", "ls");
    expect(ls.line).toBeUndefined();
    expect(ls.stdout).toContain("..");
    const rm = await cli("tasks", "rm", "..");
    expect(rm.line).toBe("taskshim: no such task: .. (see taskshim tasks ls)");
    expect(shim.urls.every((u) => u === "GET /api/tasks")).toBe(true);
  });
});
