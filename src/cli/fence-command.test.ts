import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { fence, FenceRequestError, ListingError, parseContainerListing } from "../control/fence.js";
import type { BoundedOutcome, CommandRequest, CommandRunner } from "../exec/run-bounded.js";
import {
  fenceRequestOf,
  FenceUsageError,
  formatFenceReport,
  hostErrorLine,
  parseDeadline,
  parseSshTarget,
  type FenceFlags,
} from "./fence-command.js";

const flags = (over: Partial<FenceFlags>): FenceFlags => ({
  sshOption: [],
  task: [],
  label: [],
  deadline: "30s",
  ...over,
});

describe("fence command line", () => {
  it("reads a deadline in ms, s or m, a bare number as seconds", () => {
    expect(parseDeadline("30s")).toBe(30_000);
    expect(parseDeadline("500ms")).toBe(500);
    expect(parseDeadline("2m")).toBe(120_000);
    expect(parseDeadline("5")).toBe(5_000);
    expect(parseDeadline("1.5s")).toBe(1_500);
    for (const bad of ["", "abc", "0s", "-1s", "10h", "2h"])
      expect(() => parseDeadline(bad)).toThrow(FenceUsageError);
  });

  it("reads [USER@]HOST[:PORT], and refuses what ssh would take for an option", () => {
    expect(parseSshTarget("gpu-7")).toEqual({ host: "gpu-7" });
    expect(parseSshTarget("ubuntu@gpu-7:2222")).toEqual({ host: "gpu-7", user: "ubuntu", port: 2222 });
    expect(parseSshTarget("root@[::1]:22")).toEqual({ host: "::1", user: "root", port: 22 });
    for (const bad of ["-oProxyCommand=x", "u@-h", "h:0", "h:70000", "a b", "", "h:"]) {
      expect(() => parseSshTarget(bad)).toThrow(FenceUsageError);
    }
  });

  it("refuses a command line it cannot use, saying why", () => {
    const cases: [Partial<FenceFlags>, RegExp][] = [
      [{ all: true }, /--shim URL, --ssh/],
      [{ local: true }, /--all, or --task ID/],
      [{ local: true, ssh: "h", all: true }, /exclude each other/],
      [{ local: true, all: true, task: ["a"] }, /--all and --task/],
      [{ local: true, all: true, identity: "/k" }, /need --ssh/],
      [{ local: true, all: true, sshOption: ["X=y"] }, /need --ssh/],
      [{ local: true, all: true, label: ["novalue"] }, /invalid --label/],
      [{ shim: "ftp://h", all: true }, /use http/],
      [{ shim: "not a url", all: true }, /invalid --shim/],
      [{ local: true, all: true, deadline: "never" }, /invalid --deadline/],
      [{ local: true, task: [" "] }, /needs a task id/],
    ];
    for (const [over, message] of cases) expect(() => fenceRequestOf(flags(over))).toThrow(message);
  });

  it("builds the request: --shim with an --ssh fallback, deduplicated tasks, the 30 s default", () => {
    expect(
      fenceRequestOf(
        flags({
          shim: "http://10.0.0.7:10998/x",
          ssh: "ubuntu@10.0.0.7",
          identity: "/k",
          sshOption: ["StrictHostKeyChecking=yes"],
          task: ["a", "b", "a"],
        }),
      ),
    ).toEqual({
      shimUrl: "http://10.0.0.7:10998",
      cli: {
        kind: "ssh",
        host: "10.0.0.7",
        user: "ubuntu",
        identityFile: "/k",
        options: ["StrictHostKeyChecking=yes"],
      },
      selection: { kind: "tasks", ids: ["a", "b"] },
      deadlineMs: 30_000,
      labels: [],
    });
  });
});

/** A CommandRunner that answers `docker container ls` with a listing and every other call with `rm`'s answer. */
class HostCommands implements CommandRunner {
  readonly calls: string[][] = [];
  constructor(
    private readonly listing: string,
    private readonly rm: (argv: readonly string[]) => BoundedOutcome = () => exited(0),
  ) {}
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push([...request.argv]);
    if (request.argv.includes("ls")) {
      return Promise.resolve({
        kind: "exited",
        code: 0,
        signal: null,
        stdout: Buffer.from(this.listing),
        stderr: Buffer.alloc(0),
      });
    }
    return Promise.resolve(this.rm(request.argv));
  }
  /** The container ids removed (`docker rm … ID`), in order. */
  removed(): string[] {
    return this.calls.filter((argv) => argv.includes("rm")).map((argv) => argv.at(-1) ?? "");
  }
}

const exited = (code: number, stderr = ""): BoundedOutcome => ({
  kind: "exited",
  code,
  signal: null,
  stdout: Buffer.alloc(0),
  stderr: Buffer.from(stderr),
});

/** Container ids as `docker container ls --no-trunc` prints them: 64 hex digits. */
const ID1 = "1".repeat(64);
const ID2 = "2".repeat(64);
/** One line of the listing, as docker's `{{json …}}` template writes it. */
const row = (id: string, name: string, taskId: string): string =>
  `${JSON.stringify({ id, name, task_id: taskId })}\n`;

describe("fence over the docker CLI", () => {
  const listing = row(ID1, "job-a-1", "task-a") + row(ID2, "job-b-2", "task-b");

  it("lists by the task label only, removes by id, and reports each container", async () => {
    const commands = new HostCommands(listing, (argv) =>
      argv.includes(ID2) ? exited(1, "Error response from daemon: driver failed") : exited(0),
    );
    const report = await fence(commands, {
      cli: { kind: "local" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
      labels: ["owner=me"],
    });
    expect(commands.calls[0]).toEqual([
      "docker",
      "container",
      "ls",
      "--all",
      "--no-trunc",
      "--filter",
      "label=ai.dstack.shim.is-task=true",
      "--filter",
      "label=owner=me",
      "--format",
      '{"id":{{json .ID}},"name":{{json .Names}},"task_id":{{json (.Label "ai.dstack.shim.task-id")}}}',
    ]);
    expect(commands.removed()).toEqual([ID1, ID2]);
    expect(report.via).toBe("local");
    expect(report.confirmed).toBe(false);
    expect(report.error).toBeNull();
    expect(report.results).toEqual([
      {
        container: "job-a-1",
        task_id: "task-a",
        outcome: "removed",
        reason: null,
        via: "local",
        evidence: { elapsed_ms: expect.any(Number) as number, container_id: ID1 },
      },
      {
        container: "job-b-2",
        task_id: "task-b",
        outcome: "unconfirmed",
        reason: "exit",
        via: "local",
        evidence: {
          elapsed_ms: expect.any(Number) as number,
          container_id: ID2,
          detail: "exit status 1: Error response from daemon: driver failed",
          code: 1,
          stderr: "Error response from daemon: driver failed",
        },
      },
    ]);
    const table = formatFenceReport(report);
    expect(table.split("\n")[0]).toMatch(/^CONTAINER\s+TASK ID\s+VIA\s+OUTCOME\s+DETAIL$/);
    expect(table).toContain("NOT confirmed: 2 result(s) via local");
  });

  it("touches only the selected tasks' containers", async () => {
    const commands = new HostCommands(listing);
    const report = await fence(commands, {
      cli: { kind: "local" },
      selection: { kind: "tasks", ids: ["task-b"] },
      deadlineMs: 5_000,
    });
    expect(commands.removed()).toEqual([ID2]);
    expect(report.confirmed).toBe(true);
    expect(report.results.map((r) => [r.container, r.outcome])).toEqual([["job-b-2", "removed"]]);
  });

  it("O8: a task label holding a newline, a tab and another container's id adds no row", async () => {
    // What the engine prints for such a label: the newline and the tab stay inside the JSON string.
    const injected = row(ID1, "evil", `x\n${ID2}\tvictim\ttask-v`);
    const commands = new HostCommands(injected);
    const report = await fence(commands, {
      cli: { kind: "local" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    expect(commands.removed()).toEqual([ID1]);
    expect(report.confirmed).toBe(true);
    expect(report.results.map((r) => [r.container, r.task_id])).toEqual([
      ["evil", `x\n${ID2}\tvictim\ttask-v`],
    ]);
    expect(parseContainerListing(injected)).toHaveLength(1);
  });

  it("O8: a listing line that is not one container (not JSON, a short id) fails the listing: nothing removed", async () => {
    for (const listing of [
      `${row(ID1, "a", "t")}${ID2}\tvictim\tt\n`,
      row("abc", "short", "t"),
      row("AB".repeat(32), "upper", "t"),
      `${JSON.stringify({ id: ID1, name: "a" })}\n`,
      "[]\n",
    ]) {
      expect(() => parseContainerListing(listing)).toThrow(ListingError);
      const commands = new HostCommands(listing);
      const report = await fence(commands, {
        cli: { kind: "local" },
        selection: { kind: "all" },
        deadlineMs: 5_000,
      });
      expect(commands.removed()).toEqual([]);
      expect(report.confirmed).toBe(false);
      expect(report.error).toMatchObject({ reason: "listing" });
    }
  });

  it("O9: a host that cannot be listed says why: a host-level error in the JSON, the table and its own line", async () => {
    const commands: CommandRunner = {
      run: () =>
        Promise.resolve(exited(255, "Warning: banner\nssh: connect to host h port 22: Connection refused")),
    };
    const report = await fence(commands, {
      cli: { kind: "ssh", host: "h" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    const detail =
      "listing the task containers: exit status 255: ssh: connect to host h port 22: Connection refused";
    expect(report).toEqual({
      host: "h",
      via: "ssh",
      confirmed: false,
      error: {
        reason: "ssh",
        detail,
        evidence: {
          code: 255,
          stderr: "Warning: banner\nssh: connect to host h port 22: Connection refused",
        },
      },
      results: [],
    });
    expect(hostErrorLine(report)).toBe(`h: ssh: ${detail}`);
    const table = formatFenceReport(report);
    expect(table).toContain(`host: h: ssh: ${detail}`);
    expect(table.split("\n").at(-1)).toBe("NOT confirmed: 0 result(s) via ssh on h");
  });
});

/** One fake route: the status and body it answers. */
type Route = (method: string, path: string) => { status: number; body: string } | undefined;

const json = (status: number, value: unknown): { status: number; body: string } => ({
  status,
  body: JSON.stringify(value),
});

const HEALTHY = json(200, { service: "dstack-shim", version: "1.0.0", implementation: "taskshim" });

/** A task as the shim answers it. */
const taskInfo = (id: string, status: string): unknown => ({
  id,
  status,
  termination_reason: status === "terminated" ? "terminated_by_server" : "",
  termination_message: "",
  container_name: `job-${id}`,
});

/** An HTTP server on 127.0.0.1 answering by `route` (404 when it has nothing), recording each call. */
async function fakeServer(
  route: Route,
): Promise<{ url: string; calls: string[]; close: () => Promise<void> }> {
  const calls: string[] = [];
  const server: Server = createServer((request, response) => {
    const line = `${request.method ?? ""} ${request.url ?? ""}`;
    calls.push(line);
    request.resume();
    request.once("end", () => {
      const answer = route(request.method ?? "", request.url ?? "") ?? { status: 404, body: "not found" };
      response.writeHead(answer.status, { "content-type": "application/json" }).end(answer.body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    calls,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

describe("fence through the shim's API (a fake shim on 127.0.0.1)", () => {
  const servers: { close: () => Promise<void> }[] = [];
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => s.close()));
  });
  async function serve(route: Route) {
    const server = await fakeServer(route);
    servers.push(server);
    return server;
  }

  it("terminates, removes and confirms a task the shim knows, without the docker CLI", async () => {
    let removed = false;
    const shim = await serve((method, path) => {
      if (path === "/api/healthcheck") return HEALTHY;
      if (path === "/api/tasks/t1/terminate") return json(200, taskInfo("t1", "terminated"));
      if (path === "/api/tasks/t1/remove") {
        removed = true;
        return { status: 200, body: "" };
      }
      if (path === "/api/tasks/t1" && !removed) return json(200, taskInfo("t1", "terminated"));
      return undefined;
    });
    const commands = new HostCommands("");
    const report = await fence(commands, {
      shimUrl: shim.url,
      cli: { kind: "local" },
      selection: { kind: "tasks", ids: ["t1"] },
      deadlineMs: 5_000,
    });
    expect(report).toMatchObject({ via: "api", confirmed: true, error: null });
    expect(report.results).toEqual([
      {
        container: "job-t1",
        task_id: "t1",
        outcome: "removed",
        reason: null,
        via: "api",
        evidence: {
          elapsed_ms: expect.any(Number) as number,
          steps: ["terminate: terminated", "remove: ok", "confirm: 404"],
        },
      },
    ]);
    // Every task confirmed through the API: the engine is not asked.
    expect(commands.calls).toEqual([]);
  });

  it("O7: a shim that does not know the task (404) confirms nothing; with a CLI the engine is checked and the container removed", async () => {
    // A shim restarted on a wiped or replaced home: it answers, and knows no task.
    const shim = await serve((_, path) => {
      if (path === "/api/healthcheck") return HEALTHY;
      if (path === "/api/tasks") return json(200, { tasks: [] });
      return undefined;
    });
    const alone = await fence(new HostCommands(""), {
      shimUrl: shim.url,
      selection: { kind: "tasks", ids: ["t1"] },
      deadlineMs: 5_000,
    });
    expect(alone.confirmed).toBe(false);
    expect(alone.via).toBe("api");
    expect(alone.results).toEqual([
      expect.objectContaining({
        container: null,
        task_id: "t1",
        outcome: "unconfirmed",
        reason: "unknown_to_shim",
        via: "api",
      }),
    ]);
    expect(formatFenceReport(alone)).toMatch(
      /t1\s+api\s+unconfirmed\s+unknown_to_shim: the shim does not know/,
    );

    const commands = new HostCommands(row(ID1, "job-t1", "t1") + row(ID2, "job-t2", "t2"));
    const checked = await fence(commands, {
      shimUrl: shim.url,
      cli: { kind: "local" },
      selection: { kind: "tasks", ids: ["t1"] },
      deadlineMs: 5_000,
    });
    expect(commands.removed()).toEqual([ID1]);
    expect(checked).toMatchObject({ via: "local", confirmed: true, error: null });
    expect(checked.results).toEqual([
      {
        container: "job-t1",
        task_id: "t1",
        outcome: "removed",
        reason: null,
        via: "local",
        evidence: {
          elapsed_ms: expect.any(Number) as number,
          container_id: ID1,
          shim: expect.stringMatching(
            /^unknown_to_shim: the shim does not know this task \(404\)/,
          ) as unknown,
        },
      },
    ]);

    // The engine has no such container either: now it is absent, on the engine's word.
    const absent = await fence(new HostCommands(""), {
      shimUrl: shim.url,
      cli: { kind: "local" },
      selection: { kind: "tasks", ids: ["t1"] },
      deadlineMs: 5_000,
    });
    expect(absent.confirmed).toBe(true);
    expect(absent.results).toEqual([
      expect.objectContaining({ task_id: "t1", outcome: "already_absent", via: "local" }),
    ]);
  });

  it('O7: a peer that is not a shim is not trusted: a server answering {"tasks":[]} to everything confirms nothing', async () => {
    const anything = await serve(() => json(200, { tasks: [] }));
    const other = await serve((_, path) =>
      path === "/api/healthcheck"
        ? json(200, { service: "not-a-shim", version: "1.0.0" })
        : json(200, { tasks: [] }),
    );
    for (const peer of [anything, other]) {
      const report = await fence(new HostCommands(""), {
        shimUrl: peer.url,
        selection: { kind: "all" },
        deadlineMs: 5_000,
      });
      expect(report.confirmed).toBe(false);
      expect(report.error).toMatchObject({ reason: "not_a_shim" });
      expect(report.error?.detail).toContain("is not a shim");
      // Asked nothing but the healthcheck.
      expect(peer.calls).toEqual(["GET /api/healthcheck"]);
      const tasks = await fence(new HostCommands(""), {
        shimUrl: peer.url,
        selection: { kind: "tasks", ids: ["t1"] },
        deadlineMs: 5_000,
      });
      expect(tasks.confirmed).toBe(false);
      expect(tasks.results).toEqual([expect.objectContaining({ task_id: "t1", reason: "not_a_shim" })]);
    }
    // With a CLI, the engine decides.
    const commands = new HostCommands(row(ID1, "job-t1", "t1"));
    const report = await fence(commands, {
      shimUrl: anything.url,
      cli: { kind: "local" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    expect(commands.removed()).toEqual([ID1]);
    expect(report).toMatchObject({ via: "local", confirmed: true, error: null });
  });

  it("O7: --all through a shim alone reports the engine unlisted; with a CLI the engine's listing catches what the shim does not know", async () => {
    const shim = await serve((_, path) => {
      if (path === "/api/healthcheck") return HEALTHY;
      if (path === "/api/tasks") return json(200, { tasks: [] });
      return undefined;
    });
    const alone = await fence(new HostCommands(""), {
      shimUrl: shim.url,
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    expect(alone).toMatchObject({
      via: "api",
      confirmed: false,
      error: { reason: "engine_not_listed" },
      results: [],
    });
    expect(formatFenceReport(alone)).toContain("host: 127.0.0.1:");
    const commands = new HostCommands(row(ID1, "job-old", "t-old"));
    const report = await fence(commands, {
      shimUrl: shim.url,
      cli: { kind: "local" },
      selection: { kind: "all" },
      deadlineMs: 5_000,
    });
    expect(commands.removed()).toEqual([ID1]);
    expect(report).toMatchObject({ via: "local", confirmed: true, error: null });
    expect(report.results).toEqual([
      expect.objectContaining({ task_id: "t-old", outcome: "removed", via: "local" }),
    ]);
  });

  it("O7: refuses a task id the submit would refuse before building a URL", async () => {
    const shim = await serve(() => HEALTHY);
    for (const bad of ["..", ".", "a/b", "../terminate", "%2e%2e", "-x", "a b", "x".repeat(129)]) {
      expect(() => fenceRequestOf(flags({ shim: shim.url, task: [bad] }))).toThrow(/invalid --task/);
      await expect(
        fence(new HostCommands(""), {
          shimUrl: shim.url,
          selection: { kind: "tasks", ids: [bad] },
          deadlineMs: 5_000,
        }),
      ).rejects.toThrow(FenceRequestError);
    }
    expect(shim.calls).toEqual([]);
  });
});
