/*
 * Each step of one shim's upgrade against a scripted shim: what the install's answer and the
 * component's status decide, what a poll that fails does, how the restarted process is told from
 * the old one by `/metrics`, and the gate and task checks around the restart.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import {
  DEFAULT_UPGRADE_TIMINGS,
  succeeded,
  upgradeFleet,
  upgradeShim,
  UpgradeError,
  type UpgradeResult,
  type UpgradeTimings,
} from "./upgrade.js";

const TIMINGS: UpgradeTimings = { installTimeoutMs: 1_500, restartTimeoutMs: 1_500, pollMs: 5 };

type Answer = { status: number; body: string | object };
/** The shim's state as the script sees it: restarted once a shutdown was asked for. */
interface Scripted {
  restarted: boolean;
  /** How many times each `METHOD path` was asked. */
  readonly asked: Map<string, number>;
}

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

const health = (version: string, buildId?: string): object => ({
  service: "dstack-shim",
  version,
  implementation: "taskshim",
  ...(buildId === undefined ? {} : { build: { commit: "c", dirty: false, build_id: buildId } }),
});
const component = (status: string, version: string, more: object = {}): object => ({
  name: "dstack-shim",
  version,
  status,
  ...more,
});

/**
 * A shim answering by `route`, with defaults for what a test does not script: a taskshim 1.0.0
 * (build `old`) restarting as build `new` once asked to shut down, one task `t1`, the install
 * accepted and the component installed as 1.1.0 (build `new`).
 */
async function scripted(route: (call: string, state: Scripted) => Answer | undefined): Promise<string> {
  const state: Scripted = { restarted: false, asked: new Map() };
  const server = createServer((request, response) => {
    const call = `${request.method ?? ""} ${request.url ?? ""}`;
    state.asked.set(call, (state.asked.get(call) ?? 0) + 1);
    request.resume();
    request.once("end", () => {
      const answer = route(call, state) ?? fallback(call, state);
      if (call === "POST /api/shutdown") state.restarted = true;
      const text = typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body);
      response
        .writeHead(answer.status, {
          "content-type": typeof answer.body === "string" ? "text/plain" : "application/json",
        })
        .end(text);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  servers.push(server);
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function fallback(call: string, state: Scripted): Answer {
  switch (call) {
    case "GET /api/healthcheck":
      return { status: 200, body: state.restarted ? health("1.1.0", "new") : health("1.0.0", "old") };
    case "GET /api/tasks":
      return { status: 200, body: { tasks: [{ id: "t1", status: "running" }] } };
    case "GET /api/components":
      return { status: 200, body: { components: [component("installed", "1.1.0", { build_id: "new" })] } };
    case "GET /metrics":
      return { status: 200, body: `process_start_time_seconds ${state.restarted ? 200 : 100}\n` };
    case "POST /api/components/install":
    case "POST /api/shutdown":
      return { status: 200, body: "" };
    default:
      return { status: 404, body: "not found" };
  }
}

const run = (url: string, timings = TIMINGS): Promise<UpgradeResult> =>
  upgradeShim(url, "file:///tmp/taskshim-new", undefined, timings);

describe("upgradeShim, step by step", () => {
  it("the defaults and the error's name", () => {
    expect(DEFAULT_UPGRADE_TIMINGS).toEqual({
      installTimeoutMs: 600_000,
      restartTimeoutMs: 120_000,
      pollMs: 100,
    });
    expect(new UpgradeError("x").name).toBe("UpgradeError");
  });

  it("a shim that cannot be reached fails with nothing known", async () => {
    const spare = await scripted(() => undefined);
    await new Promise<void>((resolve) => servers.pop()?.close(() => resolve()));
    const result = await run(spare);
    expect(result).toEqual({
      shim: spare,
      outcome: "failed",
      compared: null,
      from: "",
      fromBuildId: null,
      to: "",
      toBuildId: null,
      tasksBefore: 0,
      windowMs: null,
      tasksKept: null,
      error: expect.stringMatching(new RegExp(`^${spare}/api/healthcheck: .*ECONNREFUSED`)) as unknown,
    });
  });

  it("an install answered with another error than 409 fails the upgrade (not refused)", async () => {
    const url = await scripted((call) =>
      call === "POST /api/components/install" ? { status: 500, body: "disk full" } : undefined,
    );
    expect(await run(url)).toEqual({
      shim: url,
      outcome: "failed",
      compared: null,
      from: "1.0.0",
      fromBuildId: "old",
      to: "",
      toBuildId: null,
      tasksBefore: 1,
      windowMs: null,
      tasksKept: null,
      error: "POST /api/components/install: HTTP 500: disk full",
    });
  });

  it("a component in status error fails at once, saying so", async () => {
    const url = await scripted((call) =>
      call === "GET /api/components"
        ? { status: 200, body: { components: [component("error", "")] } }
        : undefined,
    );
    const result = await run(url);
    expect(result).toMatchObject({
      outcome: "failed",
      error: "install ended in status error (download, checksum or --version check failed)",
    });
  });

  it("waits out `installing` and polls that fail, reads the dstack-shim entry (not the runner's)", async () => {
    const url = await scripted((call, state) => {
      if (call !== "GET /api/components") return undefined;
      const n = state.asked.get(call) ?? 0;
      if (n === 2) return { status: 503, body: "restarting" };
      const runner = { name: "dstack-runner", version: "0.19.40", status: "installed" };
      const shim = n < 4 ? component("installing", "") : component("installed", "1.1.0", { build_id: "new" });
      return { status: 200, body: { components: [runner, shim] } };
    });
    const result = await run(url);
    expect(result).toMatchObject({
      outcome: "upgraded",
      compared: "build_id",
      to: "1.1.0",
      toBuildId: "new",
      tasksKept: 1,
    });
  });

  it("an install that never ends fails at its deadline, naming the step", async () => {
    const url = await scripted((call) =>
      call === "GET /api/components"
        ? { status: 200, body: { components: [component("installing", "")] } }
        : undefined,
    );
    const result = await run(url, { ...TIMINGS, installTimeoutMs: 50 });
    expect(result).toMatchObject({ outcome: "failed", error: "install: not within 50 ms", windowMs: null });
  });

  it("no build ids and one version: the start time is read from the line that is exactly process_start_time_seconds", async () => {
    // Another metric ending in the name, and the name with a timestamp, come first: neither is read.
    const metrics = (start: number): string =>
      `# HELP process_start_time_seconds Start time\nmy_process_start_time_seconds 7\nprocess_start_time_seconds 7 1700000000000\nprocess_start_time_seconds ${start}\n`;
    const url = await scripted((call, state) => {
      if (call === "GET /api/healthcheck") return { status: 200, body: health("1.0.0") };
      if (call === "GET /api/components")
        return { status: 200, body: { components: [component("installed", "1.0.0")] } };
      if (call === "GET /metrics") return { status: 200, body: metrics(state.restarted ? 200 : 100) };
      return undefined;
    });
    expect(await run(url)).toMatchObject({
      outcome: "upgraded",
      compared: "version",
      from: "1.0.0",
      to: "1.0.0",
    });
  });

  it("no build ids and one version, and no start time to tell the processes apart: fails before restarting", async () => {
    const url = await scripted((call) => {
      if (call === "GET /api/healthcheck") return { status: 200, body: health("1.0.0") };
      if (call === "GET /api/components")
        return { status: 200, body: { components: [component("installed", "1.0.0")] } };
      if (call === "GET /metrics") return { status: 200, body: "taskshim_engine_up 1\n" };
      if (call === "POST /api/shutdown") throw new Error("restarted");
      return undefined;
    });
    expect(await run(url)).toMatchObject({
      outcome: "failed",
      compared: "version",
      error:
        "cannot tell the restarted shim from this one (same version 1.0.0, no build id): /metrics has no process_start_time_seconds",
    });
  });

  it("without /metrics, a restart is still told by the build ids, or by another version", async () => {
    const cases: [object, object, object, object][] = [
      // Build ids on both sides, one version.
      [
        health("1.0.0", "old"),
        health("1.0.0", "new"),
        component("installed", "1.0.0", { build_id: "new" }),
        { compared: "build_id" },
      ],
      // The running build has an id, the installed one none, another version.
      [health("1.0.0", "old"), health("0.9.0"), component("installed", "0.9.0"), { compared: "version" }],
      // The running build has none, the installed one has an id.
      [
        health("1.0.0"),
        health("1.0.0", "new"),
        component("installed", "1.0.0", { build_id: "new" }),
        { compared: "build_id" },
      ],
    ];
    for (const [before, after, installed, expected] of cases) {
      const url = await scripted((call, state) => {
        if (call === "GET /api/healthcheck") return { status: 200, body: state.restarted ? after : before };
        if (call === "GET /api/components") return { status: 200, body: { components: [installed] } };
        if (call === "GET /metrics") return { status: 404, body: "not found" };
        return undefined;
      });
      expect(await run(url), JSON.stringify(after)).toMatchObject({ outcome: "upgraded", ...expected });
    }
  });

  it("the restart gate: tasks in statuses an older shim loses block the restart; an old API blocks it whole", async () => {
    const gated = async (version: string, status: string): Promise<UpgradeResult> =>
      run(
        await scripted((call) => {
          if (call === "GET /api/healthcheck")
            return { status: 200, body: { service: "dstack-shim", version } };
          if (call === "GET /api/tasks")
            return {
              status: 200,
              body: {
                tasks: [
                  { id: "t1", status },
                  { id: "t2", status: "terminated" },
                ],
              },
            };
          if (call === "POST /api/shutdown") throw new Error("restarted");
          return undefined;
        }),
      );
    expect(await gated("0.20.0", "running")).toMatchObject({
      outcome: "failed",
      error: "not safe to restart: tasks in restart-unsafe statuses: t1:running",
    });
    expect(await gated("0.18.0", "terminated")).toMatchObject({
      outcome: "failed",
      error: "not safe to restart: tasks in restart-unsafe statuses: (old API)",
    });
  });

  it("a task missing after the restart fails the upgrade, naming it", async () => {
    const url = await scripted((call, state) =>
      call === "GET /api/tasks"
        ? {
            status: 200,
            body: {
              tasks: state.restarted
                ? [{ id: "t1", status: "running" }]
                : [
                    { id: "t1", status: "running" },
                    { id: "t2", status: "terminated" },
                  ],
            },
          }
        : undefined,
    );
    const result = await run(url);
    expect(result).toMatchObject({
      outcome: "failed",
      tasksBefore: 2,
      tasksKept: 1,
      error: "tasks lost: t2",
    });
    expect(result.windowMs).toEqual(expect.any(Number));
    expect(succeeded(result)).toBe(false);
  });

  it("succeeded: upgraded or already current, nothing else", () => {
    const of = (outcome: UpgradeResult["outcome"]): boolean => succeeded({ outcome } as UpgradeResult);
    expect(
      ["upgraded", "already-current", "rolled-back", "refused", "failed"].map((o) => of(o as never)),
    ).toEqual([true, true, false, false, false]);
  });

  it("a fleet: results in input order, at least one at a time even when asked for none", async () => {
    const a = await scripted(() => undefined);
    const b = await scripted((call) =>
      call === "POST /api/components/install" ? { status: 409, body: "already installing" } : undefined,
    );
    const results = await upgradeFleet([a, b], "file:///tmp/taskshim-new", undefined, 0, TIMINGS);
    expect(results.map((r) => [r.shim, r.outcome])).toEqual([
      [a, "upgraded"],
      [b, "refused"],
    ]);
  });
});
