/**
 * The wall-clock times (ms) of the shim's JSON log lines whose `msg` is `message` (and whose
 * fields have the values of `fields`, if given), in order. taskshim writes ISO times (pino's
 * `isoTime`); a number is accepted too.
 */
export function logTimes(logs: string, message: string, fields: Record<string, string> = {}): number[] {
  const times: number[] = [];
  const quoted = JSON.stringify(message);
  for (const line of logs.split("\n")) {
    if (!line.includes(quoted)) continue;
    try {
      const entry = JSON.parse(line) as Record<string, unknown> & { msg?: string; time?: number | string };
      if (entry.msg !== message) continue;
      if (Object.entries(fields).some(([key, value]) => entry[key] !== value)) continue;
      const time = typeof entry.time === "string" ? Date.parse(entry.time) : entry.time;
      if (typeof time === "number" && Number.isFinite(time)) times.push(time);
    } catch {
      // not a whole log line
    }
  }
  return times;
}
