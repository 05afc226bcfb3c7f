import { getHeapStatistics } from "node:v8";

/** What {@link startHeapTrim} reads and calls; the defaults are V8's and the process's own. */
export interface HeapTrimOptions {
  /** How often the heap is looked at. */
  readonly intervalMs?: number;
  /** The garbage (heap reserved but not used) above which a full collection runs. */
  readonly slackBytes?: number;
  /** The full collection: `globalThis.gc`, present when Node runs with `--expose-gc`. */
  readonly gc?: (() => void) | undefined;
  /** V8's heap figures. */
  readonly heap?: () => { total_heap_size: number; used_heap_size: number };
  /** Gives the C heap's free pages back (`loadGlibcMalloc`, given by `serve`); none by default. */
  readonly releaseMalloc?: (() => void) | undefined;
  /** The process's resident set, bytes. */
  readonly rss?: () => number;
}

/** Every 10 s: reading V8's heap figures costs microseconds, a collection only runs when due. */
const INTERVAL_MS = 10_000;
/** 4 MB: more than what a few idle reconcile ticks leave behind, so an idle shim is left alone. */
const SLACK_BYTES = 4 * 1024 * 1024;
/** 2 MB of resident growth since the last release of the C heap: time for another. */
const RSS_GROWTH_BYTES = 2 * 1024 * 1024;

/**
 * Gives the shim's garbage back to the system while it is idle. After a burst of requests or
 * task churn, V8 keeps the heap it grew (24–28 MB against 19 MB idle, with 15 MB live:
 * BENCHMARKS.md, B6) until allocation pressure comes back, which on an idle agent may be never
 * (35 s after a burst of 200 task cycles, V8's own memory reducer had not shrunk it). So, when
 * more than `slackBytes` of the heap is garbage, one full collection returns it. glibc likewise
 * keeps the C heap's freed memory in its arenas: the first look (once start-up is over), every
 * collection and every 2 MB of resident growth release it (`releaseMalloc`, under a millisecond).
 * With neither a `gc` (Node not run with `--expose-gc`, as in unit tests) nor a `releaseMalloc`
 * this does nothing.
 *
 * @returns a function that stops the timer.
 */
export function startHeapTrim(options: HeapTrimOptions = {}): () => void {
  const gc = "gc" in options ? options.gc : (globalThis as { gc?: () => void }).gc;
  const releaseMalloc = options.releaseMalloc;
  if (gc === undefined && releaseMalloc === undefined) return () => undefined;
  const heap = options.heap ?? getHeapStatistics;
  const rss = options.rss ?? ((): number => process.memoryUsage.rss());
  const slack = options.slackBytes ?? SLACK_BYTES;
  let releasedAt: number | undefined; // the resident set after the last release of the C heap
  const timer = setInterval(() => {
    const { total_heap_size: total, used_heap_size: used } = heap();
    const collect = gc !== undefined && total - used > slack;
    if (collect) gc();
    if (releaseMalloc === undefined) return;
    if (collect || releasedAt === undefined || rss() > releasedAt + RSS_GROWTH_BYTES) {
      releaseMalloc();
      releasedAt = rss();
    }
  }, options.intervalMs ?? INTERVAL_MS);
  // Never what keeps the process alive.
  timer.unref();
  return () => clearInterval(timer);
}
