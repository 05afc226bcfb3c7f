/*
 * The fence's decisions, step by step: what the shim's API may confirm, what the engine's listing
 * must look like to be trusted, and the reason and evidence of every result it cannot confirm.
 * A fake shim on 127.0.0.1 and scripted docker commands.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { BoundedOutcome, CommandRequest, CommandRunner } from "../exec/run-bounded.js";
import { EXPIRED, INTERRUPTED } from "../testing/fake-command-runner.js";
import { fence, FENCE_DEFAULT_DEADLINE_MS, FenceRequestError, type FenceRequest } from "./fence.js";
import { LISTING_FORMAT, ListingError, parseContainerListing } from "./fence-cli.js";

const ID1 = "1".repeat(64);
const ID2 = "a".repeat(64);
const row = (id: string, name: string, taskId: string): string =>
  `${JSON.stringify({ id, name, task_id: taskId })}\n`;
const exited = (code: number, stdout = "", stderr = ""): BoundedOutcome => ({
  kind: "exited",
  code,
  signal: null,
  stdout: Buffer.from(stdout),
  stderr: Buffer.from(stderr),
});

/** Docker commands answered by `answer`; `ls` lists `listing` unless `answer` says otherwise. */
class Docker implements CommandRunner {
  readonly calls: string[][] = [];
  constructor(
    private readonly listing: string,
    private readonly answer: (argv: readonly string[]) => BoundedOutcome | Error | undefined = () =>
      undefined,
  ) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push([...request.argv]);
    const answer = this.answer(request.argv);
    if (answer instanceof Error) return Promise.reject(answer);
    if (answer) return Promise.resolve(answer);
    return Promise.resolve(request.argv.includes("ls") ? exited(0, this.listing) : exited(0));
  }
  removed(): string[] {
    return this.calls.filter((argv) => argv.includes("rm")).map((argv) => argv.at(-1) ?? "");
  }
}

type Answer = { status: number; body: string };
const json = (status: number, value: unknown): Answer => ({ status, body: JSON.stringify(value) });
const HEALTHY = json(200, { service: "dstack-shim", version: "1.0.0", implementation: "taskshim" });
const task = (id: string, status: string, container = `job-${id}`): Answer =>
  json(200, {
    id,
    status,
    termination_reason: "",
    termination_message: "",
    container_name: container,
  });

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(
      (s) =>
        new Promise<void>((resolve) => {
          s.closeAllConnections();
          s.close(() => resolve());
        }),
    ),
  );
});

/** A fake shim: `route` answers each `METHOD path` (404 otherwise); `calls` lists them in order. */
async function shim(route: (call: string) => Answer | undefined): Promise<{ url: string; calls: string[] }> {
  const calls: string[] = [];
  const server = createServer((request, response) => {
    const call = `${request.method ?? ""} ${request.url ?? ""}`;
    calls.push(call);
    request.resume();
    request.once("end", () => {
      const answer = route(call) ?? { status: 404, body: "not found" };
      response.writeHead(answer.status, { "content-type": "application/json" }).end(answer.body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  servers.push(server);
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, calls };
}

const tasks = (...ids: string[]): FenceRequest["selection"] => ({ kind: "tasks", ids });
const request = (more: Partial<FenceRequest>): FenceRequest => ({
  selection: tasks("t1"),
  deadlineMs: 5_000,
  ...more,
});

describe("parseContainerListing", () => {
  it("reads one container per line, skipping blank lines", () => {
    expect(parseContainerListing(`\n${row(ID1, "a", "t1")}  \n${row(ID2, "b", "")}`)).toEqual([
      { id: ID1, name: "a", taskId: "t1" },
      { id: ID2, name: "b", taskId: "" },
    ]);
    expect(parseContainerListing("")).toEqual([]);
  });

  it("fails the whole listing on a line that is not JSON, with the line cut at 200 characters", () => {
    const line = `{${"x".repeat(300)}`;
    let error: unknown;
    try {
      parseContainerListing(`${row(ID1, "a", "t1")}${line}\n`);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ListingError);
    expect(error).toMatchObject({
      reason: "listing",
      evidence: { line: line.slice(0, 200) },
      message: "listing the task containers: a line is not JSON",
    });
    expect((error as Error).cause).toBeInstanceOf(SyntaxError);
  });

  it("fails on a line that is not a container: a 64 lower-hex id, a name and a task id, all strings", () => {
    const lines = [
      "null",
      "7",
      "[]",
      JSON.stringify({ id: ID1.slice(1), name: "a", task_id: "t" }),
      JSON.stringify({ id: `${ID1}0`, name: "a", task_id: "t" }),
      JSON.stringify({ id: `x${ID1.slice(1)}`, name: "a", task_id: "t" }),
      JSON.stringify({ id: `${ID1.slice(1)}x`, name: "a", task_id: "t" }),
      JSON.stringify({ id: ID2.toUpperCase(), name: "a", task_id: "t" }),
      JSON.stringify({ id: 7, name: "a", task_id: "t" }),
      JSON.stringify({ id: ID1, name: 7, task_id: "t" }),
      JSON.stringify({ id: ID1, task_id: "t" }),
      JSON.stringify({ id: ID1, name: "a" }),
      JSON.stringify({ id: ID1, name: "a", task_id: null }),
    ];
    for (const line of lines) {
      expect(() => parseContainerListing(line), line).toThrow(
        expect.objectContaining({
          name: "ListingError",
          reason: "listing",
          evidence: { line },
          message: "listing the task containers: a line is not a container (64-hex id, name, task id)",
        }) as Error,
      );
    }
  });
});

describe("fence: what it refuses to start", () => {
  it("refuses an invalid task id, and a request with neither a shim nor a CLI", async () => {
    await expect(
      fence(new Docker(""), request({ cli: { kind: "local" }, selection: tasks("ok", "..") })),
    ).rejects.toThrow(new FenceRequestError('invalid task id ".."'));
    await expect(fence(new Docker(""), request({}))).rejects.toThrow(
      new FenceRequestError("fence needs --shim, --ssh or --local"),
    );
    await expect(fence(new Docker(""), request({ selection: { kind: "all" } }))).rejects.toThrow(
      "fence needs --shim, --ssh or --local",
    );
    await expect(fence(new Docker(""), request({}))).rejects.toMatchObject({ name: "FenceRequestError" });
    expect(FENCE_DEFAULT_DEADLINE_MS).toBe(30_000);
  });
});

describe("fence through the shim's API alone", () => {
  it("sends the terminate with timeout 0 and the server's reason, and the bearer token", async () => {
    const bodies: string[] = [];
    let removed = false;
    const peer = await shim((call) => {
      if (call === "GET /api/healthcheck") return HEALTHY;
      if (call === "POST /api/tasks/t1/terminate") return task("t1", "terminated");
      if (call === "POST /api/tasks/t1/remove") {
        removed = true;
        return { status: 200, body: "" };
      }
      if (call === "GET /api/tasks/t1" && !removed) return task("t1", "terminated");
      return undefined;
    });
    const seen: Record<string, string | undefined>[] = [];
    const server = servers.at(-1);
    server?.prependListener("request", (req: { headers: Record<string, string | undefined> }) => {
      seen.push({ authorization: req.headers.authorization });
      (req as unknown as NodeJS.ReadableStream).on("data", (chunk: Buffer) => bodies.push(chunk.toString()));
    });
    const report = await fence(new Docker(""), request({ shimUrl: peer.url, authToken: "tok" }));
    expect(report).toMatchObject({ host: new URL(peer.url).host, via: "api", confirmed: true, error: null });
    expect(peer.calls).toEqual([
      "GET /api/healthcheck",
      "POST /api/tasks/t1/terminate",
      "POST /api/tasks/t1/remove",
      "GET /api/tasks/t1",
    ]);
    expect(JSON.parse(bodies[0] ?? "{}")).toEqual({
      termination_reason: "terminated_by_server",
      termination_message: "fenced by taskshim fence",
      timeout: 0,
    });
    expect(seen.every((h) => h.authorization === "Bearer tok")).toBe(true);
  });

  it("a task without a container name is reported with container null", async () => {
    let removed = false;
    const peer = await shim((call) => {
      if (call === "GET /api/healthcheck") return HEALTHY;
      if (call === "POST /api/tasks/t1/terminate") return task("t1", "terminated", "");
      if (call === "POST /api/tasks/t1/remove") {
        removed = true;
        return { status: 200, body: "" };
      }
      if (call === "GET /api/tasks/t1" && !removed) return task("t1", "terminated");
      return undefined;
    });
    const report = await fence(new Docker(""), request({ shimUrl: peer.url }));
    expect(report.results).toEqual([expect.objectContaining({ container: null, outcome: "removed" })]);
  });

  it("each step that fails leaves the task unconfirmed, with the reason and the steps done", async () => {
    const cases: [string, (call: string) => Answer | undefined, object][] = [
      [
        "the remove fails",
        (call) =>
          call === "POST /api/tasks/t1/terminate"
            ? task("t1", "terminated")
            : call === "POST /api/tasks/t1/remove"
              ? { status: 500, body: "engine down" }
              : undefined,
        {
          container: "job-t1",
          reason: "shim",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: ["terminate: terminated"],
            detail: "POST /api/tasks/t1/remove: HTTP 500: engine down",
          },
        },
      ],
      [
        "the task is still listed after its removal",
        (call) =>
          call === "POST /api/tasks/t1/terminate"
            ? task("t1", "terminated")
            : call === "POST /api/tasks/t1/remove"
              ? { status: 200, body: "" }
              : call === "GET /api/tasks/t1"
                ? task("t1", "terminated")
                : undefined,
        {
          container: "job-t1",
          reason: "shim",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: ["terminate: terminated", "remove: ok", "confirm: the task is still listed"],
            detail: "the shim still knows the task after removing it",
          },
        },
      ],
      [
        "the confirmation fails",
        (call) =>
          call === "POST /api/tasks/t1/terminate"
            ? task("t1", "terminated")
            : call === "POST /api/tasks/t1/remove"
              ? { status: 200, body: "" }
              : call === "GET /api/tasks/t1"
                ? { status: 503, body: "busy" }
                : undefined,
        {
          container: "job-t1",
          reason: "shim",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: ["terminate: terminated", "remove: ok"],
            detail: "GET /api/tasks/t1: HTTP 503: busy",
          },
        },
      ],
      [
        "the terminate fails with another status",
        (call) => (call === "POST /api/tasks/t1/terminate" ? { status: 500, body: "no" } : undefined),
        {
          container: null,
          reason: "shim",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: [],
            detail: "POST /api/tasks/t1/terminate: HTTP 500: no",
          },
        },
      ],
      [
        "the remove answers 404 (after the terminate)",
        (call) => (call === "POST /api/tasks/t1/terminate" ? task("t1", "terminated") : undefined),
        {
          container: "job-t1",
          reason: "shim",
          evidence: expect.objectContaining({ steps: ["terminate: terminated"] }) as object,
        },
      ],
      [
        "the terminate answers 404",
        () => undefined,
        {
          reason: "unknown_to_shim",
          evidence: {
            elapsed_ms: expect.any(Number) as number,
            steps: ["terminate: 404"],
            detail:
              "the shim does not know this task (404), which proves nothing about the engine's containers " +
              "(a wiped or replaced home): give --ssh or --local to check the engine",
          },
        },
      ],
    ];
    for (const [what, route, expected] of cases) {
      const peer = await shim((call) => (call === "GET /api/healthcheck" ? HEALTHY : route(call)));
      const report = await fence(new Docker(""), request({ shimUrl: peer.url }));
      expect(report.confirmed, what).toBe(false);
      expect(report.error, what).toBeNull();
      expect(report.results, what).toEqual([
        { container: null, task_id: "t1", outcome: "unconfirmed", via: "api", ...expected },
      ]);
    }
  });

  it("a host whose shim cannot be used: each requested task unconfirmed with the host's reason", async () => {
    const mismatch = await shim((call) =>
      call === "GET /api/healthcheck"
        ? json(200, {
            service: "dstack-shim",
            version: "1.0.0",
            engine: { status: "mismatch", error: "the engine's id changed" },
          })
        : task("t1", "terminated"),
    );
    const report = await fence(
      new Docker(""),
      request({ shimUrl: mismatch.url, selection: tasks("t1", "t2") }),
    );
    const error = {
      reason: "engine_mismatch",
      detail: `${mismatch.url} is not on its home's engine: the engine's id changed`,
      evidence: { elapsed_ms: expect.any(Number) as number },
    };
    expect(report).toEqual({
      host: new URL(mismatch.url).host,
      via: "api",
      confirmed: false,
      error,
      results: ["t1", "t2"].map((id) => ({
        container: null,
        task_id: id,
        outcome: "unconfirmed",
        reason: "engine_mismatch",
        via: "api",
        evidence: { elapsed_ms: expect.any(Number) as number, detail: error.detail },
      })),
    });
    expect(mismatch.calls).toEqual(["GET /api/healthcheck"]);

    const broken = await shim(() => ({ status: 500, body: "oops" }));
    const failed = await fence(new Docker(""), request({ shimUrl: broken.url }));
    expect(failed.error).toEqual({
      reason: "not_a_shim",
      detail: `${broken.url} is not a shim: GET /api/healthcheck: HTTP 500: oops`,
      evidence: { elapsed_ms: expect.any(Number) as number },
    });

    const gone = `http://127.0.0.1:${(servers.at(-1)?.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => servers.pop()?.close(() => resolve()));
    const unreachable = await fence(new Docker(""), request({ shimUrl: gone, selection: { kind: "all" } }));
    expect(unreachable.error).toMatchObject({
      reason: "shim_unreachable",
      detail: expect.stringMatching(new RegExp(`^${gone}/api/healthcheck: .*ECONNREFUSED`)) as unknown,
    });
    expect(unreachable.results).toEqual([]);
  });

  it("--all: the tasks the shim lists, each fenced; a list that fails is the host's error", async () => {
    const removed = new Set<string>();
    const peer = await shim((call) => {
      if (call === "GET /api/healthcheck") return HEALTHY;
      if (call === "GET /api/tasks")
        return json(200, {
          tasks: [
            { id: "t1", status: "running" },
            { id: "t2", status: "terminated" },
          ],
        });
      const m = /^POST \/api\/tasks\/(t\d)\/(terminate|remove)$/.exec(call);
      if (m?.[2] === "terminate") return task(m[1] ?? "", "terminated");
      if (m?.[2] === "remove") {
        removed.add(m[1] ?? "");
        return { status: 200, body: "" };
      }
      return undefined;
    });
    const report = await fence(new Docker(""), request({ shimUrl: peer.url, selection: { kind: "all" } }));
    expect(report.results.map((r) => [r.task_id, r.outcome])).toEqual([
      ["t1", "removed"],
      ["t2", "removed"],
    ]);
    expect(report).toMatchObject({
      confirmed: false,
      error: {
        reason: "engine_not_listed",
        detail:
          "a shim lists only the tasks it knows (not those of a wiped or replaced home): " +
          "give --ssh or --local to list the engine's task containers",
        evidence: {},
      },
    });

    const failing = await shim((call) =>
      call === "GET /api/healthcheck"
        ? HEALTHY
        : call === "GET /api/tasks"
          ? { status: 500, body: "x" }
          : undefined,
    );
    const failed = await fence(new Docker(""), request({ shimUrl: failing.url, selection: { kind: "all" } }));
    expect(failed.error).toEqual({
      reason: "shim",
      detail: `cannot list the tasks of ${failing.url}: GET /api/tasks: HTTP 500: x`,
      evidence: { elapsed_ms: expect.any(Number) as number },
    });
    expect(failing.calls).toEqual(["GET /api/healthcheck", "GET /api/tasks"]);
  });
});

describe("fence over the docker CLI", () => {
  it("lists with the task label and each extra label as filters, in one bounded listing", async () => {
    const docker = new Docker(row(ID1, "job-t1", "t1"));
    const report = await fence(
      docker,
      request({ cli: { kind: "local" }, labels: ["team=a", "x=y"], selection: { kind: "all" } }),
    );
    expect(docker.calls[0]).toEqual([
      "docker",
      "container",
      "ls",
      "--all",
      "--no-trunc",
      "--filter",
      "label=ai.dstack.shim.is-task=true",
      "--filter",
      "label=team=a",
      "--filter",
      "label=x=y",
      "--format",
      LISTING_FORMAT,
    ]);
    expect(report).toMatchObject({ via: "local", confirmed: true, error: null });
    expect(report.results).toEqual([
      {
        container: "job-t1",
        task_id: "t1",
        outcome: "removed",
        reason: null,
        via: "local",
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: ID1 },
      },
    ]);
  });

  it("a container without a task id is reported with task_id null; one already gone is already_absent", async () => {
    const docker = new Docker(row(ID1, "job-x", "") + row(ID2, "job-y", "t2"), (argv) =>
      argv.includes("rm") && argv.includes(ID2)
        ? exited(1, "", `Error response from daemon: No such container: ${ID2}`)
        : undefined,
    );
    const report = await fence(docker, request({ cli: { kind: "local" }, selection: { kind: "all" } }));
    expect(report.results).toEqual([
      expect.objectContaining({ container: "job-x", task_id: null, outcome: "removed" }),
      expect.objectContaining({ container: "job-y", task_id: "t2", outcome: "already_absent", reason: null }),
    ]);
    expect(report.confirmed).toBe(true);
  });

  it("a removal that fails is unconfirmed with its exit code and stderr as evidence", async () => {
    const docker = new Docker(row(ID1, "job-t1", "t1"), (argv) =>
      argv.includes("rm") ? exited(1, "", "Error response from daemon: driver failed") : undefined,
    );
    const report = await fence(docker, request({ cli: { kind: "local" } }));
    expect(report.confirmed).toBe(false);
    expect(report.results).toEqual([
      {
        container: "job-t1",
        task_id: "t1",
        outcome: "unconfirmed",
        reason: "exit",
        via: "local",
        evidence: expect.objectContaining({
          container_id: ID1,
          code: 1,
          stderr: "Error response from daemon: driver failed",
          detail: expect.any(String) as string,
        }) as object,
      },
    ]);
  });

  it("each way the listing fails is the host's error, with every requested task unconfirmed", async () => {
    const cases: [BoundedOutcome | Error, "local" | "ssh", object][] = [
      [new Error("spawn docker ENOENT"), "local", { reason: "launch", detail: "spawn docker ENOENT" }],
      [new Error("spawn ssh ENOENT"), "ssh", { reason: "ssh" }],
      [
        EXPIRED,
        "local",
        {
          reason: "deadline",
          detail: "listing the task containers: deadline exceeded after 10000 ms",
          evidence: { operation_elapsed_ms: 10_000, cleanup: null },
        },
      ],
      [
        INTERRUPTED,
        "local",
        {
          reason: "wait",
          detail: "listing the task containers: interrupted",
          evidence: {
            operation_elapsed_ms: 5,
            cleanup: INTERRUPTED.kind === "interrupted" ? INTERRUPTED.cleanup : null,
          },
        },
      ],
      [
        exited(255, "", "Warning: banner\nssh: connect to host h port 22: Connection refused\n"),
        "ssh",
        {
          reason: "ssh",
          detail:
            "listing the task containers: exit status 255: ssh: connect to host h port 22: Connection refused",
          evidence: {
            code: 255,
            stderr: "Warning: banner\nssh: connect to host h port 22: Connection refused",
          },
        },
      ],
      [
        exited(1, "", "Cannot connect to the Docker daemon"),
        "local",
        {
          reason: "exit",
          detail: "listing the task containers: exit status 1: Cannot connect to the Docker daemon",
          evidence: { code: 1, stderr: "Cannot connect to the Docker daemon" },
        },
      ],
    ];
    for (const [outcome, kind, expected] of cases) {
      // Over SSH the docker command is one argument of ssh's.
      const docker = new Docker("", (argv) => (/\bls\b/.test(argv.join(" ")) ? outcome : undefined));
      const cli =
        kind === "local" ? ({ kind: "local" } as const) : ({ kind: "ssh", host: "h", options: [] } as const);
      const report = await fence(docker, request({ cli, selection: tasks("t1", "t2") }));
      expect(report.via).toBe(kind);
      expect(report.confirmed).toBe(false);
      expect(report.error, JSON.stringify(expected)).toMatchObject(expected);
      expect(report.results.map((r) => [r.task_id, r.outcome, r.reason, r.via])).toEqual([
        ["t1", "unconfirmed", report.error?.reason, kind],
        ["t2", "unconfirmed", report.error?.reason, kind],
      ]);
      expect(docker.removed()).toEqual([]);
    }
  });

  it("settles only what the API left open; the API's reason stays in the evidence, also of a listing that failed", async () => {
    let removed = false;
    const peer = await shim((call) => {
      if (call === "GET /api/healthcheck") return HEALTHY;
      if (call === "POST /api/tasks/t1/terminate") return task("t1", "terminated");
      if (call === "POST /api/tasks/t1/remove") {
        removed = true;
        return { status: 200, body: "" };
      }
      if (call === "GET /api/tasks/t1" && !removed) return task("t1", "terminated");
      return undefined;
    });
    const docker = new Docker(row(ID1, "job-t1", "t1") + row(ID2, "job-t2", "t2"));
    const report = await fence(
      docker,
      request({ shimUrl: peer.url, cli: { kind: "local" }, selection: tasks("t1", "t2", "t3") }),
    );
    expect(docker.removed()).toEqual([ID2]);
    expect(report.via).toBe("local");
    expect(report.confirmed).toBe(true);
    expect(report.results.map((r) => [r.task_id, r.outcome, r.via])).toEqual([
      ["t1", "removed", "api"],
      ["t2", "removed", "local"],
      ["t3", "already_absent", "local"],
    ]);
    expect(report.results[2]?.evidence).toEqual({
      detail: "no container with this task id carries the task label",
      shim: expect.stringMatching(/^unknown_to_shim: the shim does not know this task \(404\)/) as unknown,
    });

    const down = await shim(() => ({ status: 500, body: "down" }));
    const failing = new Docker("", (argv) => (argv.includes("ls") ? exited(1, "", "no engine") : undefined));
    const both = await fence(failing, request({ shimUrl: down.url, cli: { kind: "local" } }));
    expect(both.error).toEqual({
      reason: "exit",
      detail: "listing the task containers: exit status 1: no engine",
      evidence: {
        code: 1,
        stderr: "no engine",
        shim: `not_a_shim: ${down.url} is not a shim: GET /api/healthcheck: HTTP 500: down`,
      },
    });
    expect(both.results).toEqual([
      {
        container: null,
        task_id: "t1",
        outcome: "unconfirmed",
        reason: "exit",
        via: "local",
        evidence: { ...both.error?.evidence, detail: both.error?.detail },
      },
    ]);
  });
});
