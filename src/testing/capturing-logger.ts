/* A pino logger that keeps its lines, for tests that check what reached the logs. */
import { Writable } from "node:stream";
import { pino, type Logger } from "pino";

/** A logger that keeps every line it writes, to check what reached the logs. */
export function capturingLogger(): { log: Logger; lines: string[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      lines.push(chunk.toString("utf8"));
      callback();
    },
  });
  return { log: pino({ level: "trace" }, sink), lines };
}
