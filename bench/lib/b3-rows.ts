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
  /** Interleaved pairs: `node <flags> dist/taskshim.cjs --version` and `node -e 0`, ms. */
  readonly versionPairs: { readonly version: readonly number[]; readonly bare: readonly number[] };
}

/**
 * B3's rows. Their order within an id is part of the record's contract: `bench/medians.ts`
 * matches rows of several runs by id and order, so B3's first two rows keep what they were in
 * every earlier run (the recovery time, its ratio to the old floor) and new rows come after them,
 * or under ids of their own (`B3-floor`, `B3-version`).
 */
export function b3Rows(f: B3Figures): Row[] {
  const trials = f.times.length;
  const ms = round(median(f.times), 0);
  const floor = median(f.floor.times);
  const oldRatio = round(median(f.times) / f.oldFloorMs, 2);
  const physicalRatio = round(median(f.times) / floor, 2);
  const version = median(f.versionPairs.version);
  const bare = median(f.versionPairs.bare);
  const versionRow = ratioRow({
    id: "B3-version",
    name:
      `taskshim --version (node <bundle flags> dist/taskshim.cjs) against a bare node -e 0, ` +
      `${f.versionPairs.version.length} interleaved pairs, medians`,
    unit: "ms",
    taskshim: round(version, 1),
    baseline: round(bare, 1),
    target: `ratio <= ${VERSION_RATIO_TARGET}`,
    pass: false,
  });
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
      target: `<= ${PHYSICAL_FLOOR_RATIO_TARGET}`,
      pass: physicalRatio <= PHYSICAL_FLOOR_RATIO_TARGET,
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
    { ...versionRow, pass: versionRow.ratio !== null && versionRow.ratio <= VERSION_RATIO_TARGET },
  ];
}
