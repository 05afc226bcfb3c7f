/**
 * The wall-clock times (ms) of the shim's JSON log lines whose `msg` is `message`, in order.
 * taskshim writes ISO times (pino's `isoTime`); a number is accepted too.
 */
export function logTimes(logs: string, message: string): number[] {
  const times: number[] = [];
  const quoted = JSON.stringify(message);
  for (const line of logs.split("\n")) {
    if (!line.includes(quoted)) continue;
    try {
      const entry = JSON.parse(line) as { msg?: string; time?: number | string };
      if (entry.msg !== message) continue;
      const time = typeof entry.time === "string" ? Date.parse(entry.time) : entry.time;
      if (typeof time === "number" && Number.isFinite(time)) times.push(time);
    } catch {
      // not a whole log line
    }
  }
  return times;
}
