import { spawn, type ChildProcess } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import autocannon from "autocannon";
import type { Bench } from "./lib/harness.js";
import type { Fleet } from "./lib/fleet.js";
import { ratioRow, type Row } from "./lib/report.js";
import { median, round } from "./lib/stats.js";

const CONNECTIONS = 50;
const BASELINE_SERVER = resolve(import.meta.dirname, "baseline-server.ts");

/** What one autocannon run measured. */
interface Shot {
  readonly rps: number;
  readonly p99: number;
}

async function fire(url: string, seconds: number): Promise<Shot> {
  const result = await autocannon({ url, connections: CONNECTIONS, duration: seconds, pipelining: 1 });
  if (result.errors > 0 || result.non2xx > 0 || result.timeouts > 0)
    throw new Error(
      `autocannon ${url}: ${result.errors} errors, ${result.timeouts} timeouts, ${result.non2xx} non-2xx`,
    );
  return { rps: result.requests.average, p99: result.latency.p99 };
}

/** Starts the bare fastify baseline as a child process; resolves with its base URL. */
async function startBaseline(bodiesFile: string): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, ["--import", "tsx", BASELINE_SERVER, bodiesFile], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const kill = (): void => void child.kill("SIGKILL");
  process.once("exit", kill);
  child.once("exit", () => process.off("exit", kill));
  const lines = createInterface({ input: child.stdout });
  for await (const line of lines) {
    const { port } = JSON.parse(line) as { port: number };
    lines.close();
    return { url: `http://127.0.0.1:${port}`, child };
  }
  throw new Error("baseline server exited before listening");
}

/**
 * B5: API throughput with the fleet running, 50 connections (autocannon), on
 * `GET /api/tasks/{id}` and `GET /api/tasks`, beside a bare fastify route returning the same
 * body as a constant, measured in the same run. Sides alternate per trial; medians.
 */
export async function runB5(bench: Bench, fleet: Fleet): Promise<Row[]> {
  const seconds = bench.quick ? 2 : 10;
  const trials = bench.quick ? 1 : 3;
  const tasks = fleet.running.length;
  const shim = fleet.shim;
  const id = fleet.running[Math.floor(tasks / 2)]!;
  const task = await shim.request("GET", `/api/tasks/${id}`);
  const list = await shim.request("GET", "/api/tasks");
  const bodiesFile = join(await bench.tempDir("taskshim-bench-b5-"), "bodies.json");
  await writeFile(bodiesFile, JSON.stringify({ task: task.json, tasks: list.json }));
  const listed = (list.json as { tasks: unknown[] }).tasks.length;
  if (listed !== tasks) bench.note(`B5 GET /api/tasks lists ${listed} tasks (${tasks} are this run's)`);
  const baseline = await startBaseline(bodiesFile);
  const rows: Row[] = [];
  try {
    const routes = [
      { path: `/api/tasks/${id}`, label: "GET /api/tasks/{id}" },
      { path: "/api/tasks", label: `GET /api/tasks (${listed} tasks)` },
    ];
    for (const route of routes) {
      await fire(`${baseline.url}${route.path}`, 1); // warm-up (JIT, connections)
      await fire(`${shim.url}${route.path}`, 1);
      const shimShots: Shot[] = [];
      const baseShots: Shot[] = [];
      for (let t = 0; t < trials; t++) {
        const order = t % 2 === 0 ? ["base", "shim"] : ["shim", "base"];
        for (const side of order) {
          if (side === "shim") shimShots.push(await fire(`${shim.url}${route.path}`, seconds));
          else baseShots.push(await fire(`${baseline.url}${route.path}`, seconds));
        }
      }
      const fmt = (shots: Shot[]): string =>
        shots.map((s) => `${round(s.rps, 0)} req/s p99 ${s.p99} ms`).join("; ");
      bench.note(`B5 ${route.label}: taskshim ${fmt(shimShots)} | fastify ${fmt(baseShots)}`);
      const rps = ratioRow({
        id: "B5",
        name: `API throughput: ${route.label}, ${CONNECTIONS} connections, ${tasks} running tasks`,
        unit: "req/s",
        taskshim: round(median(shimShots.map((s) => s.rps)), 0),
        baseline: round(median(baseShots.map((s) => s.rps)), 0),
        target: "ratio >= 0.75",
        pass: false,
      });
      const p99 = ratioRow({
        id: "B5",
        name: `API latency p99: ${route.label}, ${CONNECTIONS} connections, ${tasks} running tasks`,
        unit: "ms",
        taskshim: median(shimShots.map((s) => s.p99)),
        baseline: median(baseShots.map((s) => s.p99)),
        target: "<= 20 ms",
        pass: false,
      });
      rows.push(
        { ...rps, pass: rps.ratio !== null && rps.ratio >= 0.75 },
        { ...p99, pass: p99.taskshim <= 20 },
      );
    }
  } finally {
    baseline.child.kill("SIGTERM");
  }
  return rows;
}
