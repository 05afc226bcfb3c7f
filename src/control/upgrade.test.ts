import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { upgradeShim, type UpgradeTimings } from "./upgrade.js";

/** A build as a fake shim reports it; no `buildId`: a release from before build ids (1.0.0). */
interface FakeBuild {
  readonly version: string;
  readonly buildId?: string;
  /**
   * Installed binary only: the build id its process reports once it runs, where the shim that
   * checked it could not tell (a release from before build ids checking a newer binary).
   */
  readonly runsAsBuildId?: string;
  /** The install failed: the binary in place is reported, with why. */
  readonly installError?: string;
  /** Running only: the rollback its supervisor reported to it (the healthcheck's `rollback`). */
  readonly rollback?: { readonly at: string; readonly reason: string; readonly binary: string };
}

/** How the fake differs from a shim that installs and restarts into the installed build. */
interface FakeTwists {
  /** Healthchecks the old process answers after the shutdown, before the new one runs. */
  readonly drainAnswers?: number;
  /** The process after the restart runs this build instead of the installed one (a rollback). */
  readonly restartsAs?: FakeBuild;
  /** The install answers 409: another install is under way. */
  readonly busy?: boolean;
}

const TIMINGS: UpgradeTimings = { installTimeoutMs: 2_000, restartTimeoutMs: 2_000, pollMs: 5 };

/**
 * A shim over HTTP, as far as the rollout reads it: the healthcheck of the process that runs, the
 * component of the binary installed, a task list, `/metrics`' start time, and a shutdown after
 * which the old process still answers a few healthchecks (it drains) before the installed build
 * takes over. `log` says in order who answered what, for the tests to check what the rollout
 * waited for.
 */
class FakeShim {
  readonly log: string[] = [];
  private running: FakeBuild & { readonly start: number; readonly name: string };
  private shutdownAt: number | undefined;
  private server: Server | undefined;
  url = "";

  private drainAnswers: number;

  constructor(
    running: FakeBuild,
    private readonly installed: FakeBuild,
    private readonly twists: FakeTwists = {},
  ) {
    this.running = { ...running, start: 1_700_000_000, name: "old" };
    this.drainAnswers = twists.drainAnswers ?? 3;
  }

  private health(): object {
    const { version, buildId, rollback } = this.running;
    return {
      service: "dstack-shim",
      version,
      implementation: "taskshim",
      ...(rollback ? { rollback } : {}),
      ...(buildId === undefined ? {} : { build: { commit: "unknown", dirty: false, build_id: buildId } }),
    };
  }

  private component(): object {
    const { version, buildId, installError } = this.installed;
    return {
      name: "dstack-shim",
      version,
      status: "installed",
      ...(buildId ? { build_id: buildId } : {}),
      ...(installError ? { error: installError } : {}),
    };
  }

  async start(): Promise<void> {
    this.server = createServer((request, response) => {
      const json = (body: object): void => {
        response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body));
      };
      const who = this.running.name;
      switch (`${request.method} ${request.url}`) {
        case "GET /api/healthcheck":
          this.log.push(`health:${who}`);
          json(this.health());
          if (this.shutdownAt !== undefined && who === "old" && --this.drainAnswers <= 0) {
            const { runsAsBuildId, ...installed } = this.twists.restartsAs ?? this.installed;
            this.running = {
              ...installed,
              ...(runsAsBuildId ? { buildId: runsAsBuildId } : {}),
              start: this.running.start + 60,
              name: "new",
            };
          }
          return;
        case "GET /api/tasks":
          this.log.push(`tasks:${who}`);
          return json({ tasks: [{ id: "t1", status: "running" }] });
        case "GET /api/components":
          return json({ components: [this.component()] });
        case "GET /metrics":
          this.log.push(`metrics:${who}`);
          response
            .writeHead(200, { "content-type": "text/plain" })
            .end(`taskshim_engine_up 1\nprocess_start_time_seconds ${this.running.start}\n`);
          return;
        case "POST /api/components/install":
        case "POST /api/shutdown":
          if (request.url === "/api/components/install" && this.twists.busy) {
            this.log.push("install:busy");
            request.resume();
            response.writeHead(409, { "content-type": "text/plain" }).end("already installing\n");
            return;
          }
          if (request.url === "/api/shutdown") {
            this.log.push("shutdown");
            this.shutdownAt = this.log.length;
          }
          request.resume();
          request.on("end", () => response.writeHead(200, { "content-type": "text/plain" }).end("\n"));
          return;
        default:
          response.writeHead(404, { "content-type": "text/plain" }).end("404 page not found\n");
      }
    });
    await new Promise<void>((resolve) => this.server?.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  /**
   * What was answered after the shutdown request, in order. The start time the rollout reads
   * before each healthcheck (to tell a rollback) is left out unless `withStarts`.
   */
  afterShutdown(withStarts = false): string[] {
    const after = this.shutdownAt === undefined ? [] : this.log.slice(this.shutdownAt);
    return withStarts ? after : after.filter((entry) => !entry.startsWith("metrics:"));
  }
}

const shims: FakeShim[] = [];
afterEach(async () => {
  await Promise.all(shims.splice(0).map((s) => s.stop()));
});

async function upgrade(running: FakeBuild, installed: FakeBuild, twists?: FakeTwists) {
  const shim = new FakeShim(running, installed, twists);
  shims.push(shim);
  await shim.start();
  const result = await upgradeShim(shim.url, "file:///tmp/taskshim-new", undefined, TIMINGS);
  return { result, shim };
}

describe("upgradeShim decides from the build identity, not the version alone", () => {
  it("upgrades to another build of the same version, and waits for its build id", async () => {
    const { result, shim } = await upgrade(
      { version: "1.0.0", buildId: "aaaaaaaaaaaaaaaaaaaa" },
      { version: "1.0.0", buildId: "bbbbbbbbbbbbbbbbbbbb" },
    );
    expect(result).toMatchObject({
      outcome: "upgraded",
      compared: "build_id",
      from: "1.0.0",
      fromBuildId: "aaaaaaaaaaaaaaaaaaaa",
      to: "1.0.0",
      toBuildId: "bbbbbbbbbbbbbbbbbbbb",
      tasksBefore: 1,
      tasksKept: 1,
    });
    expect(result.error).toBeUndefined();
    expect(result.windowMs).not.toBeNull();
    // The old process's answers after the shutdown were not taken for the new build's.
    expect(shim.afterShutdown()).toEqual([
      "health:old",
      "health:old",
      "health:old",
      "health:new",
      "tasks:new",
    ]);
  });

  it("fails, restarting nothing, when the install failed and the shim reports the binary left in place", async () => {
    const { result, shim } = await upgrade(
      { version: "1.1.0", buildId: "cccccccccccccccccccc" },
      {
        version: "1.1.0",
        buildId: "cccccccccccccccccccc",
        installError: "sha256 mismatch: expected aa…, got bb…",
      },
    );
    expect(result).toMatchObject({
      outcome: "failed",
      error: "install failed: sha256 mismatch: expected aa…, got bb…",
    });
    expect(shim.log).not.toContain("shutdown");
  });

  it("is already current when the installed build id is the running one, and restarts nothing", async () => {
    const { result, shim } = await upgrade(
      { version: "1.1.0", buildId: "cccccccccccccccccccc" },
      { version: "1.1.0", buildId: "cccccccccccccccccccc" },
    );
    expect(result).toMatchObject({
      outcome: "already-current",
      compared: "build_id",
      fromBuildId: "cccccccccccccccccccc",
      toBuildId: "cccccccccccccccccccc",
      windowMs: null,
      tasksKept: 1,
    });
    expect(shim.log).not.toContain("shutdown");
  });

  it("rolls back to a release without build ids: restarts, and waits for its build-less healthcheck", async () => {
    const { result, shim } = await upgrade(
      { version: "1.1.0", buildId: "dddddddddddddddddddd" },
      { version: "1.0.0" },
    );
    expect(result).toMatchObject({
      outcome: "upgraded",
      compared: "version",
      from: "1.1.0",
      fromBuildId: "dddddddddddddddddddd",
      to: "1.0.0",
      toBuildId: null,
      tasksKept: 1,
    });
    expect(shim.afterShutdown()).toEqual([
      "health:old",
      "health:old",
      "health:old",
      "health:new",
      "tasks:new",
    ]);
  });

  it("a rollback to the same version without build ids is not taken for the old process", async () => {
    // The running build has an id and the installed one has none: only the new process answers
    // without one, although both say 1.0.0.
    const { result, shim } = await upgrade(
      { version: "1.0.0", buildId: "eeeeeeeeeeeeeeeeeeee" },
      { version: "1.0.0" },
    );
    expect(result).toMatchObject({ outcome: "upgraded", compared: "version", toBuildId: null });
    expect(shim.afterShutdown()).toEqual([
      "health:old",
      "health:old",
      "health:old",
      "health:new",
      "tasks:new",
    ]);
  });

  it("a release from before build ids, upgraded to a build it cannot identify, is done when that build answers", async () => {
    // 1.0.0 checks the installed binary with --version only: no build id for it, though the new
    // process reports one. The wait must take the new process, not hold out for a build-less one.
    const { result, shim } = await upgrade(
      { version: "1.0.0" },
      { version: "1.0.0", runsAsBuildId: "abababababababababab" },
    );
    expect(result).toMatchObject({ outcome: "upgraded", compared: "version", toBuildId: null });
    // Told apart by its start time until the new process answered, then taken at once.
    expect(shim.afterShutdown(true).slice(-2)).toEqual(["metrics:new", "tasks:new"]);
  });

  it("upgrades a shim from before build ids to a build with one, even of the same version", async () => {
    const { result, shim } = await upgrade(
      { version: "1.0.0" },
      { version: "1.0.0", buildId: "ffffffffffffffffffff" },
    );
    expect(result).toMatchObject({
      outcome: "upgraded",
      compared: "build_id",
      fromBuildId: null,
      toBuildId: "ffffffffffffffffffff",
      tasksKept: 1,
    });
    expect(shim.afterShutdown().at(-2)).toBe("health:new");
  });

  it("with no build id on either side and one version, tells the new process by its start time", async () => {
    const { result, shim } = await upgrade({ version: "1.0.0" }, { version: "1.0.0" });
    expect(result).toMatchObject({
      outcome: "upgraded",
      compared: "version",
      fromBuildId: null,
      toBuildId: null,
    });
    // Each look-alike answer is checked against the old process's start time.
    expect(shim.afterShutdown(true)).toEqual([
      "health:old",
      "metrics:old",
      "health:old",
      "metrics:old",
      "health:old",
      "metrics:new",
      "tasks:new",
    ]);
  });

  it("says what it waited for when the new build never answers", async () => {
    const { result } = await upgrade(
      { version: "1.0.0", buildId: "aaaaaaaaaaaaaaaaaaaa" },
      { version: "1.0.0", buildId: "bbbbbbbbbbbbbbbbbbbb" },
      { drainAnswers: Number.POSITIVE_INFINITY },
    );
    expect(result).toMatchObject({ outcome: "failed", compared: "build_id" });
    expect(result.error).toBe(
      `restart as build bbbbbbbbbbbbbbbbbbbb: not within ${TIMINGS.restartTimeoutMs} ms`,
    );
  });
});

describe("U19 an upgrade reports its own outcome", () => {
  const A = { version: "1.3.3", buildId: "aaaaaaaaaaaaaaaaaaaa" };
  const B = { version: "9.9.9", buildId: "bbbbbbbbbbbbbbbbbbbb" };

  it("refuses when another upgrade is installing (409), without judging or restarting anything", async () => {
    const { result, shim } = await upgrade(A, B, { busy: true });
    expect(result).toMatchObject({
      outcome: "refused",
      error: "refused: another upgrade is in progress (the shim is installing)",
      compared: null,
      to: "",
      tasksBefore: 1,
      tasksKept: null,
    });
    expect(shim.log).not.toContain("shutdown");
  });

  it("says rolled-back when the supervisor put the previous binary back (from its report)", async () => {
    const rollback = {
      at: "2026-12-04T17:00:00.000Z",
      reason: "exited 78 before serving (ran 300ms)",
      binary: "/b",
    };
    const { result } = await upgrade(A, B, { restartsAs: { ...A, rollback } });
    expect(result).toMatchObject({
      outcome: "rolled-back",
      error: "rolled back by the shim's supervisor: the new binary exited 78 before serving (ran 300ms)",
      to: "9.9.9",
      tasksKept: 1,
    });
    expect(result.windowMs).not.toBeNull();
  });

  it("says rolled-back when the build that ran before answers from a new process (no report)", async () => {
    const { result } = await upgrade(A, B, { restartsAs: A });
    expect(result).toMatchObject({
      outcome: "rolled-back",
      error: "the shim came back as the build it ran before (1.3.3+aaaaaaaaaaaaaaaaaaaa)",
    });
  });

  it("fails at once when a third build answers (another upgrade replaced the binary)", async () => {
    const began = performance.now();
    const { result } = await upgrade(A, B, {
      restartsAs: { version: "9.9.8", buildId: "cccccccccccccccccccc" },
    });
    expect(result).toMatchObject({
      outcome: "failed",
      error: "another build answers (9.9.8+cccccccccccccccccccc): the binary was replaced meanwhile",
      tasksKept: null,
    });
    expect(performance.now() - began).toBeLessThan(TIMINGS.restartTimeoutMs);
  });
});
