import { setTimeout as sleep } from "node:timers/promises";
import type { ShimProcess } from "../test/support/shim-process.js";
import { waitStatuses, type Bench } from "./lib/harness.js";
import type { Fleet } from "./lib/fleet.js";
import type { Row } from "./lib/report.js";
import {
  callDeltas,
  cpuPercent,
  delta,
  FINALIZED,
  formatCalls,
  readMetrics,
  TICK_SECONDS,
  TICKS,
} from "./lib/shim-metrics.js";
import { round } from "./lib/stats.js";

/**
 * A reference for B4: the CPU of the fleet's shim before the fleet starts (no task of this run;
 * it may have adopted other task containers found on a shared engine), over `ms`.
 */
export async function noteIdleCpu(bench: Bench, shim: ShimProcess, ms: number): Promise<void> {
  const before = await readMetrics(shim);
  await sleep(ms);
  const after = await readMetrics(shim);
  const tasks = (await shim.request<{ tasks: unknown[] }>("GET", "/api/tasks")).json.tasks.length;
  bench.note(
    `B4 reference: the shim with no task of this run (${tasks} adopted from the engine) uses ` +
      `${round(cpuPercent(before, after), 2)} % of one core over ${ms / 1000} s ` +
      `(${delta(before, after, TICKS)} ticks, engine calls ${formatCalls(callDeltas(before, after))})`,
  );
}

/**
 * B4: the reconciler's cost with the fleet running. A quiet window of N ticks: Engine API
 * calls per tick from `/metrics` (`taskshim_engine_calls_total{op}` and the tick histogram's
 * count), and the shim's CPU from /proc/<pid>/stat (utime + stime over wall time). Then a
 * few containers are killed behind the shim's back: inspects per exited container.
 *
 * On a shared engine the shim also adopts task containers of other users; their exits cost an
 * inspect each too, so inspects are counted beside finalizations (`taskshim_tasks_finalized_total`).
 */
export async function runB4(bench: Bench, fleet: Fleet): Promise<Row[]> {
  const windowMs = bench.quick ? 8_000 : 30_000;
  const exits = bench.quick ? 3 : 5;
  const tasks = fleet.running.length;
  const shim = fleet.shim;
  await sleep(2_000); // let the last starts settle
  const before = await readMetrics(shim);
  await sleep(windowMs);
  const after = await readMetrics(shim);

  const ticks = delta(before, after, TICKS);
  const calls = callDeltas(before, after);
  const list = calls.get("list") ?? 0;
  const inspect = calls.get("inspect") ?? 0;
  const finalized = delta(before, after, FINALIZED);
  const total = [...calls.values()].reduce((a, b) => a + b, 0);
  const cpuPct = cpuPercent(before, after);
  const meanTickMs = ticks > 0 ? (delta(before, after, TICK_SECONDS) / ticks) * 1000 : Number.NaN;
  // A reading can land inside a tick (its list counted, the tick not yet): allow one off.
  const listPerTick = ticks > 0 ? list / ticks : Number.NaN;
  const idleInspects = Math.max(0, inspect - finalized);
  bench.note(
    `B4 quiet window ${windowMs / 1000} s with ${tasks} running tasks: ${ticks} ticks ` +
      `(mean ${round(meanTickMs, 1)} ms), engine calls ${formatCalls(calls)} ` +
      `(${round(total / Math.max(ticks, 1), 2)} per tick), ${finalized} tasks finalized (adopted ones), ` +
      `shim CPU ${round(after.cpu - before.cpu, 2)} s`,
  );

  // Exits behind the shim's back: each one should cost one inspect, and nothing else should.
  const victims = await fleet.takeVictims(exits);
  const exitBefore = await readMetrics(shim);
  await fleet.killContainers(victims.containers);
  await waitStatuses(shim, victims.ids, (s) => s === "terminated", { timeoutMs: 15_000 });
  await sleep(2_500); // a couple more ticks: any late inspect is counted too
  const exitAfter = await readMetrics(shim);
  const exitCalls = callDeltas(exitBefore, exitAfter);
  const exitFinalized = delta(exitBefore, exitAfter, FINALIZED);
  const exitInspects = exitCalls.get("inspect") ?? 0;
  bench.note(
    `B4 ${exits} containers killed: ${delta(exitBefore, exitAfter, TICKS)} ticks, engine calls ` +
      `${formatCalls(exitCalls)}, ${exitFinalized} tasks finalized`,
  );

  const suffix = `${tasks} running tasks`;
  return [
    {
      id: "B4",
      name: `steady state: Engine list calls per reconcile tick (${ticks} ticks, ${suffix})`,
      unit: "calls/tick",
      taskshim: round(listPerTick, 2),
      baseline: null,
      ratio: null,
      target: "= 1",
      pass: ticks > 0 && Math.abs(list - ticks) <= 1,
    },
    {
      id: "B4",
      name: `steady state: Engine inspect calls per tick for containers that did not exit (${suffix})`,
      unit: "calls/tick",
      taskshim: round(ticks > 0 ? idleInspects / ticks : Number.NaN, 2),
      baseline: null,
      ratio: null,
      target: "= 0",
      pass: idleInspects === 0,
    },
    {
      id: "B4",
      name: `steady state: inspect calls per exited container (${exits} killed, ${suffix})`,
      unit: "calls/exit",
      taskshim: round(exitInspects / Math.max(exitFinalized, 1), 2),
      baseline: null,
      ratio: null,
      target: "<= 1",
      pass: exitFinalized >= exits && exitInspects <= exitFinalized,
    },
    {
      id: "B4",
      name: `steady state: shim CPU over ${windowMs / 1000} s (${suffix})`,
      unit: "% of one core",
      taskshim: round(cpuPct, 2),
      baseline: null,
      ratio: null,
      target: "<= 2 %",
      pass: cpuPct <= 2,
    },
  ];
}
