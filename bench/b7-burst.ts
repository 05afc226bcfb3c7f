import type Docker from "dockerode";
import type { ShimProcess } from "../test/support/shim-process.js";
import type { Bench } from "./lib/harness.js";
import { ratioRow, type Row } from "./lib/report.js";
import { RunningTimes } from "./lib/running-times.js";
import { median, round } from "./lib/stats.js";

const COMMAND = ["sleep", "3600"];

/** The longest a burst may take to be all `running`. */
const BURST_TIMEOUT_MS = 120_000;

/**
 * `count` concurrent submits, from just before the first `POST` to the moment the shim's event
 * stream stamps the last of them `running` (as B1: {@link RunningTimes}).
 */
async function shimTrial(
  bench: Bench,
  shim: ShimProcess,
  running: RunningTimes,
  trial: number,
  count: number,
): Promise<number> {
  const ids = Array.from({ length: count }, (_, i) => bench.name(`b7t${trial}`, i));
  const started = Date.now();
  await Promise.all(ids.map((id) => shim.submit(bench.taskConfig(id, COMMAND))));
  const times = await Promise.all(ids.map((id) => running.runningAt(id, BURST_TIMEOUT_MS)));
  await bench.removeTasks(shim, ids);
  return Math.max(...times) - started;
}

/** `count` concurrent create+start of the same containers through the Engine API. */
async function baselineTrial(bench: Bench, count: number): Promise<number> {
  const specs: Docker.ContainerCreateOptions[] = [];
  for (let i = 0; i < count; i++) specs.push(await bench.baselineSpec(bench.baselineName("b7"), COMMAND));
  const started = performance.now();
  const ids = await Promise.all(specs.map((spec) => bench.baselineRun(spec)));
  const elapsed = performance.now() - started;
  await bench.removeContainers(ids);
  return elapsed;
}

/**
 * B7: a burst of concurrent submits until all are `running`, beside the same number of
 * concurrent create+start calls on the Engine API. Trials alternate which side goes first;
 * the figure is the median wall time.
 */
export async function runB7(bench: Bench): Promise<Row[]> {
  const count = bench.quick ? 20 : 100;
  const trials = bench.quick ? 2 : 3;
  const shim = await bench.startShim();
  const running = await RunningTimes.open(shim);
  const shimTimes: number[] = [];
  const baseTimes: number[] = [];
  try {
    for (let t = 0; t < trials; t++) {
      const order = t % 2 === 0 ? ["base", "shim"] : ["shim", "base"];
      for (const kind of order) {
        if (kind === "shim") shimTimes.push(await shimTrial(bench, shim, running, t, count));
        else baseTimes.push(await baselineTrial(bench, count));
      }
    }
  } finally {
    await running.close();
    await bench.stopShim(shim);
  }
  bench.note(
    `B7 burst of ${count}: taskshim ${shimTimes.map((v) => round(v, 0)).join("/")} ms, ` +
      `engine ${baseTimes.map((v) => round(v, 0)).join("/")} ms`,
  );
  const row = ratioRow({
    id: "B7",
    name: `burst: ${count} concurrent submits → all running, median of ${trials}`,
    unit: "ms",
    taskshim: round(median(shimTimes), 0),
    baseline: round(median(baseTimes), 0),
    target: "ratio <= 1.10",
    pass: false,
  });
  return [{ ...row, pass: row.ratio !== null && row.ratio <= 1.1 }];
}
