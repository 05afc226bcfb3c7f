import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { firstAnswer } from "./lib/first-answer.js";
import { Bench } from "./lib/harness.js";
import { Fleet } from "./lib/fleet.js";
import { median, percentile, round } from "./lib/stats.js";

/*
 * `npx tsx bench/ab-restart.ts --variant A=dist/taskshim --variant 'B=/tmp/other|NODE_OPTIONS=--trace-gc'
 *   [--tasks 200] [--rounds 15] [--victims 0]`
 *
 * Restarts side by side, for an A/B of a change to the restart (BENCHMARKS.md's profile table):
 * grows one fleet of running tasks, then `--rounds` times restarts the shim once as each variant,
 * turn about (the order rotates every round), `kill -9` before each, on the same home and port.
 * A variant is `label=binary`, then any `|NAME=value` of its environment; a binary ending in `.cjs` is run as a
 * bundle by node. Each restart is timed spawn → the first complete `GET /api/tasks` (B3's client);
 * `--victims` containers are SIGKILLed while the shim is down, as B3 does. Prints the median,
 * the quartiles and every restart per variant.
 */

/** A pause after the fleet is grown back: the engine's work for the new containers ends before the next restart. */
const SETTLE_MS = 1_500;

interface Variant {
  readonly label: string;
  readonly binary: string;
  readonly env: NodeJS.ProcessEnv;
}

function parseVariant(text: string): Variant {
  const [label, rest] = text.split(/=(.*)/s, 2);
  const [binary, ...env] = (rest ?? "").split("|");
  if (!label || !binary) throw new Error(`--variant ${text}: expected label=binary[|NAME=value...]`);
  const pairs = env.map((pair): [string, string] => {
    const [name = "", value = ""] = pair.split(/=(.*)/s, 2);
    return [name, value];
  });
  return { label, binary, env: Object.fromEntries(pairs) };
}

const { values } = parseArgs({
  options: {
    variant: { type: "string", multiple: true, default: [] },
    tasks: { type: "string", default: "200" },
    rounds: { type: "string", default: "15" },
    victims: { type: "string", default: "0" },
  },
});
const variants = (values.variant ?? []).map(parseVariant);
if (variants.length === 0) throw new Error("at least one --variant label=binary");
const rounds = Number(values.rounds);
const victims = Number(values.victims);
const bench = new Bench(false);
try {
  await bench.setup();
  const fleet = new Fleet(bench, await bench.startShim());
  const size = Number(values.tasks);
  bench.log(`growing a fleet of ${size}`);
  await fleet.grow(size);
  const times = new Map(variants.map((v) => [v.label, [] as number[]]));
  for (let round = 0; round < rounds; round++) {
    for (let i = 0; i < variants.length; i++) {
      const variant = variants[(i + round) % variants.length] as Variant;
      const taken = await fleet.takeVictims(victims);
      await bench.killShim(fleet.shim);
      await fleet.killContainers(taken.containers);
      const started = performance.now();
      fleet.shim = await bench.startShim({
        home: fleet.shim.home,
        port: fleet.shim.port,
        waitReady: false,
        ...(variant.binary.endsWith(".cjs") ? { bundle: variant.binary } : { binary: variant.binary }),
        env: variant.env,
      });
      const first = await firstAnswer(fleet.shim, 30_000);
      times.get(variant.label)?.push(first.at - started);
      const open = taken.ids.filter((id) => first.tasks.get(id) !== "terminated");
      if (open.length > 0) throw new Error(`${variant.label}: ${open.length} exits while down not final`);
      // The same home for every restart: the victims' tasks removed, the fleet grown back.
      await fleet.shim.waitReady();
      await bench.removeTasks(fleet.shim, taken.ids);
      await fleet.grow(size);
      await sleep(SETTLE_MS);
    }
  }
  for (const [label, ms] of times) {
    const q = (p: number): number => round(percentile(ms, p), 0);
    console.log(
      `${label.padEnd(16)} median ${round(median(ms), 1)} ms  (q1 ${q(25)}, q3 ${q(75)})  ` +
        ms.map((m) => round(m, 0)).join(" "),
    );
  }
  await bench.removeTasks(fleet.shim, fleet.running);
} finally {
  await bench.cleanup();
}
