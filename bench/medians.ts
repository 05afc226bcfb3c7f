import { readdir, readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { chooseRuns, combineRuns, type MedianRow } from "./lib/medians.js";
import { cell, textCell, type RunRecord } from "./lib/report.js";

/*
 * `npx tsx bench/medians.ts [--version X.Y.Z] [--runs 3] [--only B3,B8]`
 *
 * The medians of the newest `--runs` full runs of one shim version (default: the newest run's),
 * from the records `npm run bench` keeps in bench/results/runs/ (with `--only`, of the partial
 * runs of exactly those benchmarks, in runs/partial/), as a markdown table on stdout
 * with every run's own figure beside the median. A full run takes over an hour, so the runs a
 * median needs are made one or two per session and kept in the repository.
 */

const RUNS = resolve(import.meta.dirname, "results/runs");

const { values } = parseArgs({
  options: {
    version: { type: "string" },
    runs: { type: "string", default: "3" },
    only: { type: "string" },
  },
});
const wanted = Number(values.runs);
if (!Number.isInteger(wanted) || wanted < 1) {
  process.stderr.write("--runs: expected an integer >= 1\n");
  process.exit(2);
}

const records: RunRecord[] = [];
for (const dir of [RUNS, join(RUNS, "partial")]) {
  const files = (await readdir(dir).catch(() => [])).filter((f) => f.endsWith(".json")).sort();
  for (const file of files) records.push(JSON.parse(await readFile(join(dir, file), "utf8")) as RunRecord);
}
const only = values.only
  ?.toUpperCase()
  .split(",")
  .map((id) => id.trim());
const chosen = chooseRuns(records, {
  runs: wanted,
  ...(values.version ? { version: values.version } : {}),
  ...(only ? { only } : {}),
});
const version = chosen[0]?.version ?? values.version;
const kind = only
  ? `partial run${chosen.length === 1 ? "" : "s"} (${only.join(",")})`
  : `full run${chosen.length === 1 ? "" : "s"}`;
if (chosen.length === 0) {
  process.stderr.write(`no ${kind} of ${version ?? "any version"} in ${RUNS}\n`);
  process.exit(1);
}

const line = (r: MedianRow): string =>
  `| ${r.id} | ${textCell(r.name)} | ${r.unit} | ${cell(r.taskshim)} | ${r.runs.map(cell).join(" / ")} | ` +
  `${cell(r.baseline)} | ${cell(r.ratio)} | ${textCell(r.target)} | ${r.pass ? "✅" : "❌"} |`;
const rows = combineRuns(chosen);
const passed = rows.filter((r) => r.pass).length;
process.stdout.write(
  [
    `## taskshim benchmarks: medians of ${chosen.length} ${kind} of ${version}` +
      (chosen.length < wanted ? ` (${wanted} asked for)` : ""),
    "",
    ...chosen.map(
      (r) =>
        `- ${r.date} (${r.commit}, ${r.engines}, Node.js ${r.node}, ${r.cpus} CPUs, load at the end ` +
        `${r.load.join(" ")}, ${r.seconds} s)`,
    ),
    "",
    "| id | benchmark | unit | taskshim | each run | baseline | ratio | target | pass |",
    "|---|---|---|--:|--:|--:|--:|---|:-:|",
    ...rows.map(line),
    "",
    `${passed}/${rows.length} targets met by the medians`,
    "",
  ].join("\n"),
);
