import { InvalidArgumentError } from "@commander-js/extra-typings";

const UNITS_MS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };
const DURATION = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/;

/**
 * Parses the one duration syntax of every duration flag: `500ms`, `10s`, `2m`, `1h`, or a bare
 * number of seconds (`10` = `10s`, as `docker stop --time`). Returns milliseconds.
 *
 * @throws InvalidArgumentError (commander's, so the flag is named) for anything else.
 */
export function parseDuration(text: string): number {
  const match = DURATION.exec(text.trim());
  if (!match) {
    throw new InvalidArgumentError("expected a duration like 10s, 500ms or 2m (a bare number is seconds)");
  }
  const ms = Number(match[1]) * (UNITS_MS[match[2] ?? "s"] ?? 1_000);
  if (!Number.isSafeInteger(Math.round(ms))) throw new InvalidArgumentError("duration too long");
  return Math.round(ms);
}

/** A commander parser for a duration flag within [min, max] milliseconds. */
export function durationFlag(minMs = 0, maxMs = Number.MAX_SAFE_INTEGER) {
  return (text: string): number => {
    const ms = parseDuration(text);
    if (ms < minMs || ms > maxMs) {
      throw new InvalidArgumentError(
        `expected a duration from ${formatDuration(minMs)} to ${formatDuration(maxMs)}`,
      );
    }
    return ms;
  };
}

/** `1500` → `1.5s`, `120000` → `2m`, `250` → `250ms`: the shortest exact spelling. */
export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`;
  if (ms >= 1_000 || ms === 0) return `${ms / 1_000}s`;
  return `${ms}ms`;
}
