import type Docker from "dockerode";
import type { ShimProcess } from "../test/support/shim-process.js";
import { waitStatuses, type Bench } from "./lib/harness.js";
import { ratioRow, type Row } from "./lib/report.js";
import { median, round } from "./lib/stats.js";

const COMMAND = ["sleep", "3600"];

/** `count` concurrent submits, then `GET /api/tasks` until all are `running`. */
async function shimTrial(bench: Bench, shim: ShimProcess, trial: number, count: number): Promise<number> {
  const ids = Array.from({ length: count }, (_, i) => bench.name(`b7t${trial}`, i));
  const started = performance.now();
  await Promise.all(ids.map((id) => shim.submit(bench.taskConfig(id, COMMAND))));
  const seen = await waitStatuses(shim, ids, (s) => {
    if (s === "terminated") throw new Error("B7: a task terminated during the burst");
    return s === "running";
  });
  const elapsed = seen - started;
  await bench.removeTasks(shim, ids);
  return elapsed;
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
  const shimTimes: number[] = [];
  const baseTimes: number[] = [];
  try {
    for (let t = 0; t < trials; t++) {
      const order = t % 2 === 0 ? ["base", "shim"] : ["shim", "base"];
      for (const kind of order) {
        if (kind === "shim") shimTimes.push(await shimTrial(bench, shim, t, count));
        else baseTimes.push(await baselineTrial(bench, count));
      }
    }
  } finally {
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
