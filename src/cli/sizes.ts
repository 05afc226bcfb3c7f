/** A size flag (`--memory 4GiB`) that cannot be read as a byte count. */
export class InvalidSizeError extends Error {
  override readonly name = "InvalidSizeError";
}

/*
 * IEC suffixes are powers of 1024 and SI suffixes powers of 1000, as written. A bare letter
 * (`4g`) follows `docker run --memory`, where it means GiB: users type Docker's spelling.
 */
const MULTIPLIERS: Readonly<Record<string, number>> = {
  "": 1,
  b: 1,
  k: 1024,
  kib: 1024,
  kb: 1000,
  m: 1024 ** 2,
  mib: 1024 ** 2,
  mb: 1000 ** 2,
  g: 1024 ** 3,
  gib: 1024 ** 3,
  gb: 1000 ** 3,
  t: 1024 ** 4,
  tib: 1024 ** 4,
  tb: 1000 ** 4,
};

const SIZE_PATTERN = /^(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)$/i;

/**
 * Parses a human size into whole bytes: `1073741824`, `512MiB`, `1.5GiB`, `4g` (= 4 GiB),
 * `2GB` (= 2·10⁹). Fractions are rounded down to a byte.
 *
 * @throws InvalidSizeError for anything else, a negative size, or more than 2^53 - 1 bytes.
 */
export function parseSize(text: string): number {
  const match = SIZE_PATTERN.exec(text.trim());
  const multiplier = match ? MULTIPLIERS[(match[2] ?? "").toLowerCase()] : undefined;
  if (!match || multiplier === undefined) {
    throw new InvalidSizeError(
      `invalid size ${JSON.stringify(text)} (use bytes or a suffix: KiB, MiB, GiB, TiB, kB, MB, GB, TB, k, m, g, t)`,
    );
  }
  const bytes = Math.floor(Number(match[1]) * multiplier);
  if (!Number.isSafeInteger(bytes)) throw new InvalidSizeError(`size ${JSON.stringify(text)} is too large`);
  return bytes;
}

const UNITS = ["kB", "MB", "GB", "TB", "PB"] as const;

/**
 * Formats a byte count the way Docker's progress does (decimal units, one decimal):
 * `0 B`, `999 B`, `12.3 MB`.
 */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 1000) return `${Math.max(0, Math.round(bytes || 0))} B`;
  let value = bytes;
  let unit: string = "B";
  for (const next of UNITS) {
    if (value < 1000) break;
    value /= 1000;
    unit = next;
  }
  // 999.96 kB would print as "1000.0 kB"; carry it into the next unit instead.
  const rounded = Math.round(value * 10) / 10;
  if (rounded >= 1000 && unit !== UNITS[UNITS.length - 1]) {
    return `${(rounded / 1000).toFixed(1)} ${UNITS[UNITS.indexOf(unit as (typeof UNITS)[number]) + 1]}`;
  }
  return `${rounded.toFixed(1)} ${unit}`;
}
