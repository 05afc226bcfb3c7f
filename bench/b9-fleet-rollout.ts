import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import pLimit from "p-limit";
import { freePort, tempHome } from "../test/support/shim-process.js";
import { taskStatuses, type Bench } from "./lib/harness.js";
import { FLEET_COMMAND } from "./lib/fleet.js";
import type { Row } from "./lib/report.js";
import { round } from "./lib/stats.js";
import {
  formatCauses,
  runUpgrade,
  STEADY_CLIENT_TIMEOUT_MS,
  steadyClient,
  SupervisedShim,
  type RestartStages,
  type RolloutBinary,
  type UpgradeRow,
} from "./lib/supervised.js";

/** Shims upgraded at once by `taskshim upgrade --concurrency`. */
const CONCURRENCY = 10;
/** Running tasks per shim. */
const TASKS_PER_SHIM = 4;
/** Each shim's own steady client (healthchecks per second): 30 shims → 60 req/s in all. */
const RATE_PER_SHIM = 2;

interface Pass {
  readonly label: string;
  readonly ms: number;
  readonly results: readonly UpgradeRow[];
  readonly failed: number;
  readonly refused: number;
  readonly timedOut: number;
  readonly causes: string;
  readonly sent: number;
  /** The slowest shim's restart, stage by stage (from its logs). */
  readonly slowestStages: RestartStages | undefined;
}

/**
 * B9: a fleet rollout simulated on this machine. `shims` shims, each with its own home, port,
 * `taskshim supervise` (holding its socket) and 4 running tasks, are upgraded A → B → A by one
 * `taskshim upgrade --shims FILE --concurrency 10`, while each shim has a steady client of its
 * own. Reports the total time of each pass, the slowest shim, tasks kept and failed requests.
 */
export async function runB9(
  bench: Bench,
  shimCount: number,
  binaries: { A: RolloutBinary; B: RolloutBinary },
): Promise<Row[]> {
  const shims: SupervisedShim[] = [];
  const passes: Pass[] = [];
  const problems: string[] = [];
  const tasksTotal = shimCount * TASKS_PER_SHIM;
  let tasksKept = 0;
  try {
    // Started 3 at a time: 30 binaries booting at once on 2 cores would only measure the queue.
    const started = performance.now();
    await pLimit(3).map(
      Array.from({ length: shimCount }, (_, i) => i),
      async () => {
        const home = await tempHome("taskshim-bench-b9-");
        // The harness removes it with the run's other dirs.
        await bench.trackDir(home);
        const shim = await SupervisedShim.start(bench, binaries.A, home, await freePort());
        shims.push(shim);
      },
    );
    bench.log(`B9: ${shimCount} supervised shims up in ${round((performance.now() - started) / 1000, 1)} s`);
    const ids = new Map<SupervisedShim, string[]>();
    let seq = 0;
    await pLimit(5).map(shims, async (shim) => {
      const mine = Array.from({ length: TASKS_PER_SHIM }, () => bench.name("b9", seq++));
      ids.set(shim, mine);
      for (const id of mine) {
        const response = await fetch(`${shim.url}/api/tasks`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(bench.taskConfig(id, FLEET_COMMAND)),
          signal: AbortSignal.timeout(30_000),
        });
        if (response.status !== 200)
          throw new Error(`submit ${id}: ${response.status} ${await response.text()}`);
      }
      const deadline = performance.now() + 120_000;
      for (;;) {
        const statuses = await taskStatuses(shim);
        if (mine.every((id) => statuses.get(id) === "running")) break;
        if (performance.now() > deadline) throw new Error(`B9: tasks of ${shim.url} not running`);
        await sleep(200);
      }
    });
    const list = join(await bench.tempDir("taskshim-bench-b9-list-"), "shims.txt");
    await writeFile(list, `${shims.map((s) => s.url).join("\n")}\n`);
    bench.log(`B9: ${tasksTotal} tasks running; rolling out`);

    let current = binaries.A;
    for (const next of [binaries.B, binaries.A]) {
      await sleep(1_000);
      const clients = shims.map((s) => steadyClient(s.url, RATE_PER_SHIM));
      await sleep(500);
      const began = Date.now();
      const upgrade = await runUpgrade(current, next, { shimsFile: list, concurrency: CONCURRENCY });
      await sleep(300);
      const seen = await Promise.all(clients.map((c) => c.stop()));
      const slowestRow = upgrade.results.reduce((a, b) => ((b.windowMs ?? 0) > (a.windowMs ?? 0) ? b : a));
      passes.push({
        label: `${current.version}→${next.version}`,
        ms: upgrade.ms,
        results: upgrade.results,
        failed: seen.reduce((sum, s) => sum + s.failed, 0),
        refused: seen.reduce((sum, s) => sum + s.refused, 0),
        timedOut: seen.reduce((sum, s) => sum + s.timedOut, 0),
        slowestStages: shims.find((s) => s.url === slowestRow.shim)?.restartStages(began, Date.now()),
        causes: formatCauses(
          seen.reduce((all, s) => {
            for (const [code, n] of s.causes) all.set(code, (all.get(code) ?? 0) + n);
            return all;
          }, new Map<string, number>()),
        ),
        sent: seen.reduce((sum, s) => sum + s.sent, 0),
      });
      for (const r of upgrade.results)
        if (r.outcome !== "upgraded" || r.tasksKept !== r.tasksBefore)
          problems.push(
            `${current.version}→${next.version} ${r.shim}: ${r.outcome} ${r.tasksKept}/${r.tasksBefore} ${r.error ?? ""}`,
          );
      current = next;
    }
    for (const shim of shims) {
      const statuses = await taskStatuses(shim);
      tasksKept += (ids.get(shim) ?? []).filter((id) => statuses.get(id) === "running").length;
    }
  } finally {
    await Promise.all(shims.map((s) => s.stop()));
    // Its 120 containers would otherwise run on, on the same engine, through B6 and the fleet's rows.
    await bench.removeContainers((await bench.ownContainers(bench.name("b9", ""))).map((c) => c.Id));
  }
  const slowest = (p: Pass): number =>
    Math.max(...p.results.map((r) => r.windowMs ?? Number.POSITIVE_INFINITY));
  const refused = passes.reduce((sum, p) => sum + p.refused, 0);
  const timedOut = passes.reduce((sum, p) => sum + p.timedOut, 0);
  const unanswered = passes.reduce((sum, p) => sum + p.failed, 0) - refused - timedOut;
  const sent = passes.reduce((sum, p) => sum + p.sent, 0);
  const totalMs = passes.reduce((sum, p) => sum + p.ms, 0);
  bench.note(
    `B9 ${shimCount} shims × ${TASKS_PER_SHIM} tasks, --concurrency ${CONCURRENCY}: ` +
      passes
        .map(
          (p) =>
            `${p.label} ${round(p.ms / 1000, 1)} s, slowest shim's window ${slowest(p)} ms${formatStages(p.slowestStages)}, ` +
            `${p.failed} failed of ${p.sent}${p.causes ? ` (${p.causes})` : ""}`,
        )
        .join("; ") +
      `; tasks running at the end ${tasksKept}/${tasksTotal}` +
      (problems.length > 0 ? `; PROBLEMS: ${problems.join("; ")}` : ""),
  );
  const row = (name: string, unit: string, value: number, target: string, pass: boolean): Row => ({
    id: "B9",
    name,
    unit,
    taskshim: value,
    baseline: null,
    ratio: null,
    target,
    pass,
  });
  return [
    row(
      `fleet rollout: ${shimCount} supervised shims × ${TASKS_PER_SHIM} tasks upgraded A→B→A, ` +
        `taskshim upgrade --shims FILE --concurrency ${CONCURRENCY}, total of both passes`,
      "s",
      round(totalMs / 1000, 1),
      "— (reported; extrapolation in BENCHMARKS.md)",
      problems.length === 0,
    ),
    row(
      "fleet rollout: slowest shim's window (shutdown requested → new version answering)",
      "ms",
      Math.max(...passes.map(slowest)),
      "— (reported)",
      problems.length === 0,
    ),
    row(
      "fleet rollout: tasks still running after A→B→A",
      "tasks",
      tasksKept,
      `= ${tasksTotal}`,
      tasksKept === tasksTotal && tasksTotal > 0,
    ),
    row(
      `fleet rollout: refused connections (ECONNREFUSED), a ${RATE_PER_SHIM} req/s client per shim (${sent} sent)`,
      "requests",
      refused,
      "0",
      refused === 0,
    ),
    row(
      "fleet rollout: requests of those clients closed unanswered (ECONNRESET, UND_ERR_SOCKET)",
      "requests",
      unanswered,
      "0",
      unanswered === 0,
    ),
    // Not lost: such a request waits in the held socket's backlog for the new shim, and the
    // client gives up first when the window is longer than its timeout (see the stages).
    row(
      `fleet rollout: requests of those clients not answered within their ${STEADY_CLIENT_TIMEOUT_MS / 1000} s (TimeoutError)`,
      "requests",
      timedOut,
      "— (reported: a request waits for its shim's window)",
      problems.length === 0,
    ),
  ];
}

/** " (drain 0.3 s, exit → spawned 0.2 s, Node.js and bundle loaded 4.9 s, restore 0.7 s, → serving 0 s)". */
function formatStages(stages: RestartStages | undefined): string {
  if (stages === undefined) return "";
  const s = (ms: number): string => `${round(ms / 1000, 1)} s`;
  return (
    ` (drain ${s(stages.drainMs)}, exit → spawned ${s(stages.spawnMs)}, Node.js and bundle loaded ${s(stages.loadMs)}, ` +
    `restore ${s(stages.restoreMs)}, → serving ${s(stages.serveMs)})`
  );
}
