import { afterEach, beforeEach, vi } from "vitest";
import { armFailpoints } from "../runner/failpoints.js";
import { capturingLogger } from "./capturing-logger.js";
import { makeContext, type TestEnv } from "./test-context.js";

/** A TaskRunner test's context and the JSON log lines it wrote. */
export interface RunnerEnv {
  readonly env: TestEnv;
  readonly lines: string[];
}

/**
 * The set-up the TaskRunner test files share: before each test a fresh context whose log lines
 * are captured (handed to `use`), after it the failpoints disarmed, the mocks restored and the
 * context disposed.
 */
export function useRunnerEnv(use: (current: RunnerEnv) => void): void {
  let env: TestEnv | undefined;
  beforeEach(async () => {
    const captured = capturingLogger();
    env = await makeContext({ log: captured.log });
    use({ env, lines: captured.lines });
  });
  afterEach(async () => {
    armFailpoints(undefined);
    vi.restoreAllMocks();
    await env?.dispose();
  });
}

/** The captured log lines whose `msg` is `msg`, parsed. */
export function loggedAs(lines: readonly string[], msg: string): Record<string, unknown>[] {
  return lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === msg);
}
