import type { ShimProcess } from "../../test/support/shim-process.js";
import { wallMs } from "./harness.js";
import { cpuSeconds } from "./proc.js";
import { parsePrometheus, sumOf, type Sample } from "./prometheus.js";

/** Engine API calls by operation and result (the shim's adapter counts every call). */
export const ENGINE_CALLS = "taskshim_engine_calls_total";
/** The time engine calls took, seconds, by operation (the sum of their duration histogram). */
export const ENGINE_CALL_SECONDS = "taskshim_engine_call_duration_seconds_sum";
/** Reconcile ticks (the count of the tick duration histogram) and their total duration. */
export const TICKS = "taskshim_reconcile_tick_seconds_count";
export const TICK_SECONDS = "taskshim_reconcile_tick_seconds_sum";
/** Tasks that reached `terminated`, by reason. */
export const FINALIZED = "taskshim_tasks_finalized_total";

/** One reading of the shim's `/metrics` and of its CPU time (/proc/<pid>/stat). */
export interface Reading {
  readonly samples: Sample[];
  /** utime + stime, seconds. */
  readonly cpu: number;
  /** Wall clock, ms. */
  readonly wall: number;
}

export async function readMetrics(shim: ShimProcess): Promise<Reading> {
  const answer = await shim.request("GET", "/metrics");
  if (answer.status !== 200) throw new Error(`GET /metrics: ${answer.status}`);
  const pid = shim.child.pid;
  if (pid === undefined) throw new Error("shim has no pid");
  return { samples: parsePrometheus(answer.text), cpu: await cpuSeconds(pid), wall: wallMs() };
}

/** The growth of a counter (all label sets summed) between two readings. */
export function delta(before: Reading, after: Reading, name: string): number {
  return sumOf(after.samples, name) - sumOf(before.samples, name);
}

/** Engine API calls between two readings, by operation (ok and error summed); zeros left out. */
export function callDeltas(before: Reading, after: Reading): Map<string, number> {
  const ops = new Set(after.samples.filter((s) => s.name === ENGINE_CALLS).map((s) => s.labels.op ?? ""));
  const deltas = new Map<string, number>();
  for (const op of ops) {
    const n = sumOf(after.samples, ENGINE_CALLS, { op }) - sumOf(before.samples, ENGINE_CALLS, { op });
    if (n !== 0) deltas.set(op, n);
  }
  return deltas;
}

/** The shim's CPU between two readings, in % of one core. */
export function cpuPercent(before: Reading, after: Reading): number {
  return ((after.cpu - before.cpu) / ((after.wall - before.wall) / 1000)) * 100;
}

/** `{"list":3,…}` for the notes. */
export function formatCalls(calls: Map<string, number>): string {
  return JSON.stringify(Object.fromEntries(calls));
}
