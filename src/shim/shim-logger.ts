import { join } from "node:path";
import { pino, type DestinationStream, type Logger } from "pino";
import { redactUrl, redactUrlsIn } from "../components/redact-url.js";
import type { LogFormat, ShimConfig } from "../config/shim-config.js";
import { LogFileSink } from "../state/log-file-sink.js";

/** Paths and fields that may carry secrets: never logged. */
const REDACT = [
  "registry_password",
  "*.registry_password",
  "password",
  "*.password",
  "req.headers.authorization",
];

/** pino's error serializer, with every URL in the message and stack redacted. */
function serializeError(error: Error): ReturnType<typeof pino.stdSerializers.err> {
  const serialized = pino.stdSerializers.err(error);
  serialized.message = redactUrlsIn(serialized.message);
  if (typeof serialized.stack === "string") serialized.stack = redactUrlsIn(serialized.stack);
  return serialized;
}

/** Whether stdout shows readable text: `auto` is text on a terminal only. */
export function logsAsText(format: LogFormat, stdoutIsTty: boolean): boolean {
  return format === "text" || (format === "auto" && stdoutIsTty);
}

/**
 * stdout as a person reads it: one line per event, `HH:MM:ss.l LEVEL: message key=value…`
 * (pino-pretty, loaded only in this mode so the JSON path carries none of it), colours on a
 * terminal only. Every field of the JSON line is on it: the redaction happened before.
 */
async function textStream(out: NodeJS.WritableStream, colorize: boolean): Promise<DestinationStream> {
  const { default: pretty } = await import("pino-pretty");
  return pretty({
    destination: out,
    sync: true,
    colorize,
    singleLine: true,
    translateTime: "SYS:yyyy-mm-dd HH:MM:ss.l",
    ignore: "pid,hostname",
  });
}

/**
 * The shim's logger: pino JSON lines into `<home>/shim.log` always, and on stdout JSON or text
 * (`--log-format`). ISO-8601 times, secrets and URL credentials redacted.
 */
export async function createLogger(
  config: Pick<ShimConfig, "home" | "logLevel" | "logFormat">,
  out: { readonly stream: NodeJS.WritableStream; readonly isTty: boolean } = {
    stream: process.stdout,
    isTty: process.stdout.isTTY,
  },
): Promise<{ log: Logger; logFile: LogFileSink }> {
  // Not pino.destination: its failed write (a full or read-only disk) is an error event that
  // ends the process. This sink drops what it cannot write and reopens the file by itself; it
  // creates the file 0600 (only root reads the shim's log: it names users, paths and configs).
  const logFile = new LogFileSink(join(config.home, "shim.log"));
  const stdout = logsAsText(config.logFormat, out.isTty)
    ? await textStream(out.stream, out.isTty)
    : (out.stream as DestinationStream);
  const log = pino(
    {
      level: config.logLevel,
      base: { pid: process.pid },
      // ISO 8601, readable by a person and by every log shipper (epoch ms are neither).
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: REDACT, censor: "[redacted]" },
      // URLs lose userinfo and query string wherever they are logged (an expected failure is
      // logged as its message alone, under `error`).
      serializers: {
        err: serializeError,
        error: (text: unknown) => (typeof text === "string" ? redactUrlsIn(text) : text),
        url: (url: unknown) => (typeof url === "string" ? redactUrl(url) : url),
      },
    },
    pino.multistream([
      { level: config.logLevel, stream: stdout },
      { level: config.logLevel, stream: logFile },
    ]),
  );
  return { log, logFile };
}
