import { readFile } from "node:fs/promises";
import { connect, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import type { ShimProcess } from "../test/support/shim-process.js";
import type { Bench } from "./lib/harness.js";
import { ratioRow, type Row } from "./lib/report.js";
import { sumOf } from "./lib/prometheus.js";
import { readMetrics } from "./lib/shim-metrics.js";
import { round } from "./lib/stats.js";

/**
 * An image no registry serves (nothing listens on port 1): the start fails at the pull, so a
 * cycle costs the lifecycle (durable writes, status changes, events) and no container, and the
 * engine's own variance stays out of the figure.
 */
const NO_IMAGE = "127.0.0.1:1/bn-none:1";
const STREAMS = 500;

/** Opens `count` event streams; a reading one discards what it gets, as a follower would. */
async function openStreams(port: number, count: number, read: boolean): Promise<Socket[]> {
  const sockets: Socket[] = [];
  for (let i = 0; i < count; i += 50) {
    const batch = await Promise.all(
      Array.from(
        { length: Math.min(50, count - i) },
        () =>
          new Promise<Socket>((resolve, reject) => {
            const socket = connect(port, "127.0.0.1", () => {
              socket.write("GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n");
              resolve(socket);
            });
            socket.once("error", reject);
          }),
      ),
    );
    for (const socket of batch) {
      socket.on("error", () => undefined);
      if (read) socket.on("data", () => undefined);
      else socket.pause();
    }
    sockets.push(...batch);
  }
  return sockets;
}

/** `count` submit → terminate → remove cycles, one after the other: wall time in ms. */
async function cycles(bench: Bench, shim: ShimProcess, label: string, count: number): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < count; i++) {
    const id = bench.name(`b10${label}`, i);
    await shim.submit({ id, name: id, image_name: NO_IMAGE, command: ["true"] });
    const terminated = await shim.terminate(id, "terminated_by_user", "bench", 0);
    if (terminated.status !== 200) throw new Error(`B10 terminate ${id}: ${terminated.status}`);
    const removed = await shim.remove(id);
    if (removed.status !== 200) throw new Error(`B10 remove ${id}: ${removed.status} ${removed.text}`);
  }
  return performance.now() - started;
}

/** The kernel's TCP memory, in pages (`/proc/net/sockstat`, `TCP: … mem N`). */
async function tcpMemPages(): Promise<number> {
  const text = await readFile("/proc/net/sockstat", "utf8").catch(() => "");
  return Number(/^TCP:.* mem (\d+)/m.exec(text)?.[1] ?? Number.NaN);
}

/**
 * B10: the cost of the event stream's fan-out to the task lifecycle. The same submit → terminate
 * → remove cycles with no stream open and with 500 reading streams, alternated in four runs;
 * the figure is the total wall time of each side. A note adds 500 streams that do not read:
 * how many are cut off, and the kernel's TCP memory meanwhile.
 */
export async function runB10(bench: Bench): Promise<Row[]> {
  const perRun = bench.quick ? 100 : 250;
  const shim = await bench.startShim({ env: { TASKSHIM_MAX_EVENT_STREAMS: String(STREAMS + 100) } });
  const times = { none: 0, streams: 0 };
  const cpu = { none: 0, streams: 0 };
  let streams: Socket[] = [];
  try {
    await cycles(bench, shim, "warm", 20);
    for (const [run, side] of (["none", "streams", "none", "streams"] as const).entries()) {
      if (side === "streams") streams = await openStreams(shim.port, STREAMS, true);
      await sleep(500);
      const before = await readMetrics(shim);
      times[side] += await cycles(bench, shim, `r${run}`, perRun);
      cpu[side] += (await readMetrics(shim)).cpu - before.cpu;
      for (const socket of streams.splice(0)) socket.destroy();
      await sleep(500);
    }

    const memBefore = await tcpMemPages();
    streams = await openStreams(shim.port, STREAMS, false);
    await cycles(bench, shim, "idle", bench.quick ? 100 : 250);
    const memDuring = await tcpMemPages();
    await sleep(12_000); // past the 10 s stall bound
    await cycles(bench, shim, "after", 20);
    const cut = sumOf((await readMetrics(shim)).samples, "taskshim_event_streams_cut_off_total");
    const memAfter = await tcpMemPages();
    const page = 4096;
    bench.note(
      `B10 ${STREAMS} non-reading streams: ${cut} cut off; kernel TCP memory ` +
        `${round(((memDuring - memBefore) * page) / 2 ** 20, 1)} MiB above the start while they were open, ` +
        `${round(((memAfter - memBefore) * page) / 2 ** 20, 1)} MiB once cut off`,
    );
  } finally {
    for (const socket of streams) socket.destroy();
    await bench.stopShim(shim);
  }
  const total = perRun * 2;
  bench.note(
    `B10 ${total} cycles each: ${round(times.none / total, 2)} ms a cycle without streams, ` +
      `${round(times.streams / total, 2)} ms with ${STREAMS} reading streams; the shim's CPU ` +
      `${round((cpu.none * 1000) / total, 2)} ms and ${round((cpu.streams * 1000) / total, 2)} ms a cycle`,
  );
  const row = ratioRow({
    id: "B10",
    name: `event fan-out: ${total} submit→terminate→remove cycles with ${STREAMS} reading streams (baseline: none)`,
    unit: "ms",
    taskshim: round(times.streams, 0),
    baseline: round(times.none, 0),
    target: "ratio <= 1.5",
    pass: false,
  });
  return [{ ...row, pass: row.ratio !== null && row.ratio <= 1.5 }];
}
