import { setTimeout as sleep } from "node:timers/promises";
import { taskStatuses, type Bench } from "./lib/harness.js";
import type { Fleet } from "./lib/fleet.js";
import type { Row } from "./lib/report.js";
import { median, round } from "./lib/stats.js";
import {
  formatCauses,
  runUpgrade,
  steadyClient,
  SupervisedShim,
  type RolloutBinary,
  type SteadyClientResult,
} from "./lib/supervised.js";

const TARGET_MS = 500;
/** The steady client's rate during each upgrade. */
const RATE = 50;

interface Trial {
  readonly label: string;
  /** Old shim gone (the supervisor saw it exit) → the first answer of the new version, ms. */
  readonly windowMs: number;
  /** `taskshim upgrade`'s own window: shutdown requested → new version answering (polled). */
  readonly upgradeWindowMs: number;
  readonly client: SteadyClientResult;
  readonly problems: string[];
}

/**
 * One rollout `from` → `to` of the supervised shim while a steady client sends a healthcheck
 * every 20 ms: the window is measured from the supervisor's "shim exited" line (old process
 * gone) to the first answer that reports the new version (new one serving).
 */
async function trial(
  shim: SupervisedShim,
  from: RolloutBinary,
  to: RolloutBinary,
  size: number,
): Promise<Trial> {
  const exitsBefore = shim.exits().length;
  const client = steadyClient(shim.url, RATE);
  await sleep(500);
  const upgrade = await runUpgrade(from, to, { shim: shim.url });
  await sleep(300);
  const seen = await client.stop();
  const problems: string[] = [];
  const [result] = upgrade.results;
  if (result?.outcome !== "upgraded") problems.push(`upgrade ${result?.outcome}: ${result?.error ?? ""}`);
  if (result && (result.tasksBefore < size || result.tasksKept !== result.tasksBefore))
    problems.push(`tasks kept ${result.tasksKept}/${result.tasksBefore} (fleet ${size})`);
  const exitedAt = shim.exits()[exitsBefore];
  const servingAt = seen.firstAnswerOf.get(to.version);
  if (exitedAt === undefined) problems.push("the supervisor did not report the old shim's exit");
  if (servingAt === undefined) problems.push(`no answer from ${to.version}`);
  return {
    label: `${from.version}→${to.version}`,
    windowMs: exitedAt !== undefined && servingAt !== undefined ? servingAt - exitedAt : Number.NaN,
    upgradeWindowMs: result?.windowMs ?? Number.NaN,
    client: seen,
    problems,
  };
}

/**
 * B8: the upgrade window with the fleet running. The fleet's shim is stopped (its containers
 * keep running) and the same home and port are taken over by `taskshim supervise` of binary A
 * holding the API socket; then `taskshim upgrade` rolls A → B → A (→ B in a full run), each
 * under a steady 50 req/s client. Median window over the rollouts, and every failed request.
 */
export async function runB8(
  bench: Bench,
  fleet: Fleet,
  size: number,
  binaries: { A: RolloutBinary; B: RolloutBinary },
): Promise<Row[]> {
  await fleet.grow(size);
  const { home, port } = fleet.shim;
  await bench.stopShim(fleet.shim);
  const shim = await SupervisedShim.start(bench, binaries.A, home, port);
  const trials: Trial[] = [];
  try {
    const order = bench.quick ? [binaries.B, binaries.A] : [binaries.B, binaries.A, binaries.B];
    let current = binaries.A;
    for (const next of order) {
      await sleep(1_000);
      trials.push(await trial(shim, current, next, size));
      current = next;
    }
    const statuses = await taskStatuses(shim);
    const lost = fleet.running.filter((id) => statuses.get(id) !== "running");
    if (lost.length > 0)
      trials[trials.length - 1]?.problems.push(`${lost.length} fleet tasks not running at the end`);
  } finally {
    await shim.stop();
    // The fleet's shim again (plain, as before), for anything after B8.
    fleet.shim = await bench.startShim({ home, port });
  }
  const problems = trials.flatMap((t) => t.problems);
  const refused = trials.reduce((sum, t) => sum + t.client.refused, 0);
  const unanswered = trials.reduce((sum, t) => sum + t.client.failed, 0) - refused;
  const sent = trials.reduce((sum, t) => sum + t.client.sent, 0);
  const windows = trials.map((t) => t.windowMs);
  bench.note(
    `B8 upgrade with ${size} running tasks under ${RATE} req/s: ` +
      trials
        .map(
          (t) =>
            `${t.label} window ${round(t.windowMs, 0)} ms (upgrade command's shutdown → new version ${t.upgradeWindowMs} ms; ` +
            `${t.client.failed} failed of ${t.client.sent}${t.client.failed > 0 ? ` (${formatCauses(t.client.causes)})` : ""}, slowest answer ${round(t.client.maxLatencyMs, 0)} ms)`,
        )
        .join("; ") +
      (problems.length > 0 ? `; PROBLEMS: ${problems.join("; ")}` : "; every task kept"),
  );
  const ms = round(median(windows), 0);
  return [
    {
      id: "B8",
      name:
        `upgrade window: old shim gone → new one serving, ${size} running tasks, taskshim supervise ` +
        `holding the socket, median of ${trials.length} rollouts`,
      unit: "ms",
      taskshim: ms,
      baseline: null,
      ratio: null,
      target: `<= ${TARGET_MS} ms; in every run, every task kept`,
      pass: ms <= TARGET_MS && problems.length === 0,
    },
    {
      id: "B8",
      name: `refused connections (ECONNREFUSED) of a steady ${RATE} req/s client during those rollouts (${sent} sent)`,
      unit: "requests",
      taskshim: refused,
      baseline: null,
      ratio: null,
      target: "0",
      pass: refused === 0,
    },
    {
      id: "B8",
      name: "requests of that client closed unanswered (ECONNRESET, UND_ERR_SOCKET: the old shim closing)",
      unit: "requests",
      taskshim: unanswered,
      baseline: null,
      ratio: null,
      target: "0",
      pass: unanswered === 0,
    },
  ];
}
