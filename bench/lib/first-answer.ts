import type { ChildProcess } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * The restarted process is polled this often (a refused connection costs little, but the booting
 * process needs the CPU); the first answer is dated midway between the previous attempt and it.
 */
export const POLL_MS = 10;

/** A process that serves `GET /api/tasks` at `url`: the restarted shim, or B3's floor. */
export interface Answering {
  readonly child: ChildProcess;
  readonly url: string;
  /** What it printed so far (for the error when it does not answer). */
  readonly logs: string;
}

/**
 * The first 200 answer of `GET /api/tasks`, and when it came (performance.now()): polled every
 * {@link POLL_MS}, a refused connection retried. B3 times the restarted shim and its floor with
 * this same client, so the poll's phase costs both the same.
 */
export async function firstAnswer(
  process: Answering,
  timeoutMs: number,
): Promise<{ at: number; tasks: Map<string, string> }> {
  const deadline = performance.now() + timeoutMs;
  let previous = performance.now();
  while (performance.now() < deadline) {
    if (process.child.exitCode !== null) throw new Error(`restarted process exited:\n${process.logs}`);
    try {
      const sent = performance.now();
      const response = await fetch(`${process.url}/api/tasks`, { signal: AbortSignal.timeout(5_000) });
      const at = (previous + performance.now()) / 2;
      previous = sent;
      if (response.status === 200) {
        const body = (await response.json()) as { tasks: { id: string; status: string }[] };
        return { at, tasks: new Map(body.tasks.map((t) => [t.id, t.status])) };
      }
      await response.body?.cancel();
    } catch {
      // not listening yet
      previous = performance.now();
    }
    await sleep(POLL_MS);
  }
  throw new Error(`restarted process did not serve within ${timeoutMs} ms:\n${process.logs}`);
}
