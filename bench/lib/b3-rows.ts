import { ratioRow, type Row } from "./report.js";
import { median, round } from "./stats.js";

/** B3's absolute target: restart → serving all, ms. */
export const B3_TARGET_MS = 2_000;
/**
 * B3 ÷ the old floor (a bare `taskshim --version` plus one container list). With socket
 * activation and `supervise` no request is refused during a restart (B8), so this is latency, not
 * loss: at most twice its floor. Kept beside the physical floor so that runs compare across it.
 */
export const OLD_FLOOR_RATIO_TARGET = 2.0;
/** B3 ÷ the physical floor (bench/b3-floor.ts): what the shim's own code may cost on a restart. */
export const PHYSICAL_FLOOR_RATIO_TARGET = 2.5;
/** `taskshim --version` ÷ `node -e 0`: what every operator's CLI call pays above Node.js itself. */
export const VERSION_RATIO_TARGET = 1.8;

/** The figures of one B3 run, measured in it. */
export interface B3Figures {
  /** Fleet size (running tasks at the restart). */
  readonly size: number;
  /** Containers killed while the shim was down, per trial. */
  readonly victims: number;
  /** spawn → first complete answer of each trial, ms. */
  readonly times: readonly number[];
  /** What the trials' first answers got wrong (none: every exit while down final at once). */
  readonly problems: readonly string[];
  /** The old floor: bare start (`taskshim --version`) + one labelled container list, ms. */
  readonly oldFloorMs: number;
  /** The physical floor's runs (spawn → first answer, ms), and what their answers got wrong. */
  readonly floor: {
    readonly times: readonly number[];
    /** task.json files the floor read (the home B3 restarts). */
    readonly files: number;
    readonly problems: readonly string[];
  };
  /** Interleaved rounds: `node <flags> dist/taskshim.cjs --version`, the binary's, `node -e 0`, ms. */
  readonly versionPairs: {
    readonly version: readonly number[];
    readonly binary?: readonly number[];
    readonly bare: readonly number[];
  };
  /** The single binary's trials (as released: from its startup snapshot), where it was measured. */
  readonly binary?: { readonly times: readonly number[]; readonly problems: readonly string[] };
  /**
   * The restarted shim's settled RSS serving the fleet, MB, against B6's idle RSS of the same run
   * (NaN when B6 did not run: the row is then reported) plus B6's margin.
   */
  readonly memory?: { readonly rss: number; readonly idleRss: number; readonly marginMb: number };
}

/**
 * B3's rows. Their order within an id is part of the record's contract: `bench/medians.ts`
 * matches rows of several runs by id and order, so B3's first two rows keep what they were in
 * every earlier run (the recovery time, its ratio to the old floor) and new rows come after them,
 * or under ids of their own (`B3-floor`, `B3-version`, `B3-binary`).
 *
 * The targets on the physical floor and on `node -e 0` are the single binary's, the form a host
 * runs (a release, dstack's deployment, `deploy/taskshim.service`); the bundle's ratios (`npm
 * start`: Node compiles the whole bundle at every start) are reported beside them.
 */
export function b3Rows(f: B3Figures): Row[] {
  const trials = f.times.length;
  const ms = round(median(f.times), 0);
  const floor = median(f.floor.times);
  const oldRatio = round(median(f.times) / f.oldFloorMs, 2);
  const physicalRatio = round(median(f.times) / floor, 2);
  return [
    {
      id: "B3",
      name:
        `recovery: kill -9 with ${f.size} running tasks, restart → API serves all ` +
        `(${f.victims} exits while down final at once), median of ${trials}`,
      unit: "ms",
      taskshim: ms,
      baseline: null,
      ratio: null,
      target: "<= 2 s; exits while down final before the first answer",
      pass: ms <= B3_TARGET_MS && f.problems.length === 0,
    },
    {
      id: "B3",
      name:
        `recovery time above ÷ its old floor in the same run: bare start (taskshim --version) ` +
        `+ one labelled container list = ${round(f.oldFloorMs, 0)} ms`,
      unit: "ratio",
      taskshim: oldRatio,
      baseline: null,
      ratio: null,
      target: `<= ${OLD_FLOOR_RATIO_TARGET}`,
      pass: oldRatio <= OLD_FLOOR_RATIO_TARGET,
    },
    {
      id: "B3",
      name: `recovery time above ÷ its physical floor in the same run (B3-floor) = ${round(floor, 0)} ms`,
      unit: "ratio",
      taskshim: physicalRatio,
      baseline: null,
      ratio: null,
      target: f.binary
        ? "reported (the bundle; B3-binary holds the target)"
        : `<= ${PHYSICAL_FLOOR_RATIO_TARGET}`,
      pass: f.binary !== undefined || physicalRatio <= PHYSICAL_FLOOR_RATIO_TARGET,
    },
    {
      id: "B3-floor",
      name:
        `physical floor of a restart: Node.js without the shim's code lists the task containers once, ` +
        `reads the home's ${f.floor.files} task.json, binds and answers GET /api/tasks; ` +
        `spawn → first answer, median of ${f.floor.times.length}`,
      unit: "ms",
      taskshim: round(floor, 0),
      baseline: null,
      ratio: null,
      target: "reported",
      pass: f.floor.problems.length === 0,
    },
    ...versionRows(f.versionPairs),
    ...(f.memory ? [memoryRow(f.size, f.memory)] : []),
    ...(f.binary ? binaryRows(f.binary, floor) : []),
  ];
}

/** B3-rss: the restarted shim's memory, judged as B6 judges a shim with the fleet that never restarted. */
function memoryRow(size: number, memory: NonNullable<B3Figures["memory"]>): Row {
  const target = round(memory.idleRss + memory.marginMb, 1);
  const judged = Number.isFinite(target);
  return {
    id: "B3-rss",
    name: `memory: RSS of the shim B3 restarted (bundle), serving ${size} tasks, settled; target B6's idle + ${memory.marginMb} MB`,
    unit: "MB",
    taskshim: memory.rss,
    baseline: null,
    ratio: null,
    target: judged ? `<= ${target} MB` : "reported (B6 did not run)",
    pass: !judged || memory.rss <= target,
  };
}

/**
 * B3-version: `taskshim --version` against `node -e 0`, the bundle's row, then the single
 * binary's where it was timed; the target is the binary's then, the bundle's ratio reported.
 */
function versionRows(pairs: B3Figures["versionPairs"]): Row[] {
  const row = (what: string, times: readonly number[]): Row => {
    const timed = ratioRow({
      id: "B3-version",
      name: `${what} against a bare node -e 0, ${times.length} interleaved rounds, medians`,
      unit: "ms",
      taskshim: round(median(times), 1),
      baseline: round(median(pairs.bare), 1),
      target: `ratio <= ${VERSION_RATIO_TARGET}`,
      pass: false,
    });
    return { ...timed, pass: timed.ratio !== null && timed.ratio <= VERSION_RATIO_TARGET };
  };
  const bundle = row("taskshim --version (node <bundle flags> dist/taskshim.cjs)", pairs.version);
  if (!pairs.binary) return [bundle];
  return [
    { ...bundle, target: "reported (the bundle; the binary's row holds the target)", pass: true },
    row("taskshim --version of the single binary (from its startup snapshot)", pairs.binary),
  ];
}

/** B3-binary: the single binary's trials, absolute and against the physical floor of the run. */
function binaryRows(binary: NonNullable<B3Figures["binary"]>, floor: number): Row[] {
  const ms = round(median(binary.times), 0);
  const ratio = round(median(binary.times) / floor, 2);
  return [
    {
      id: "B3-binary",
      name:
        `recovery as B3, restarted as the single binary (from its startup snapshot), ` +
        `turn about with B3's trials, median of ${binary.times.length}`,
      unit: "ms",
      taskshim: ms,
      baseline: null,
      ratio: null,
      target: "<= 2 s; exits while down final before the first answer",
      pass: ms <= B3_TARGET_MS && binary.problems.length === 0,
    },
    {
      id: "B3-binary",
      name: `the single binary's recovery time ÷ the physical floor in the same run (B3-floor) = ${round(floor, 0)} ms`,
      unit: "ratio",
      taskshim: ratio,
      baseline: null,
      ratio: null,
      target: `<= ${PHYSICAL_FLOOR_RATIO_TARGET}`,
      pass: ratio <= PHYSICAL_FLOOR_RATIO_TARGET,
    },
  ];
}
