import type { RunnerObserver } from "../runner/runner-context.js";

/** A runner observer that records what it is told: tick durations, engine health, final reasons. */
export function recordingObserver(): RunnerObserver & {
  ticks: number[];
  seen: boolean[];
  finalized: string[];
} {
  const ticks: number[] = [];
  const seen: boolean[] = [];
  const finalized: string[] = [];
  return {
    ticks,
    seen,
    finalized,
    taskStarted: () => undefined,
    taskFinalized: (reason) => finalized.push(reason),
    tickDone: (seconds) => ticks.push(seconds),
    engineSeen: (up) => seen.push(up),
    pulledBytes: () => undefined,
  };
}
