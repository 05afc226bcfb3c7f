import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ShimMetrics } from "../api/metrics.js";
import { buildApi } from "../api/server.js";
import { ComponentService } from "../components/component-service.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { VERSION } from "../version.js";
import type { ConnectionHandoff, DrainTimes } from "../api/connection-drain.js";
import type { EventStreamLimits } from "../api/event-streams.js";
import type { EngineInfo } from "../docker/engine-info.js";
import type { ShimPhaseView } from "../lifecycle/shim-lifecycle.js";
import { FakeCommandRunner } from "./fake-command-runner.js";
import type { TestEnv } from "./test-context.js";

/** Options of {@link buildTestApi}. */
export interface TestApiOptions {
  /** Runs the components' `--version` checks (default: a fake that answers nothing). */
  readonly commands?: CommandRunner;
  readonly requestShutdown?: (force: boolean) => void;
  readonly authToken?: string;
  /** Leave the runner binary out (default: an empty file stands in for it). */
  readonly withoutRunner?: boolean;
  /** How long `close()` keeps open connections (default: the shim's). */
  readonly drainTimes?: DrainTimes;
  /** Where idle connections go at `close()` (default: none; they are closed). */
  readonly handoff?: ConnectionHandoff;
  /** Bounds of `GET /api/events` (default: the shim's). */
  readonly eventStreams?: Partial<EventStreamLimits>;
  /** Which engine the healthcheck names (default: none detected). */
  readonly engineInfo?: () => EngineInfo | undefined;
  /** The shim's lifecycle phase the healthcheck shows (default: none). */
  readonly lifecycle?: () => ShimPhaseView;
  /** The metrics the API serves (default: new ones over the context's store). */
  readonly metrics?: ShimMetrics;
}

/** The real HTTP edge over a test context (fake engine, temp home): what the API tests inject into. */
export function buildTestApi(env: TestEnv, options: TestApiOptions = {}): ReturnType<typeof buildApi> {
  const runner = join(env.home, "bin", "dstack-runner");
  if (options.withoutRunner !== true) {
    mkdirSync(join(env.home, "bin"), { recursive: true });
    writeFileSync(runner, "");
  }
  const components = new ComponentService(
    { runner, shim: join(env.home, "bin", "dstack-shim") },
    options.commands ?? new FakeCommandRunner(),
    env.ctx.log,
    env.ctx.shutdown,
  );
  return buildApi({
    version: VERSION,
    store: env.ctx.store,
    docker: env.ctx.docker,
    runner: env.runner,
    reconciler: env.reconciler,
    inventory: env.ctx.inventory,
    components,
    log: env.ctx.log,
    metrics: options.metrics ?? new ShimMetrics(env.ctx.store, VERSION),
    ...(env.ctx.storage ? { storage: env.ctx.storage } : {}),
    requestShutdown: options.requestShutdown ?? (() => undefined),
    ...(options.authToken !== undefined ? { authToken: options.authToken } : {}),
    ...(options.drainTimes ? { drainTimes: options.drainTimes } : {}),
    ...(options.handoff ? { handoff: options.handoff } : {}),
    ...(options.eventStreams ? { eventStreams: options.eventStreams } : {}),
    ...(options.engineInfo ? { engineInfo: options.engineInfo } : {}),
    ...(options.lifecycle ? { lifecycle: options.lifecycle } : {}),
  });
}
