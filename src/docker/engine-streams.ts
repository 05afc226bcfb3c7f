/*
 * The streamed reads of the Engine API adapter: a container's log tail and the event stream of
 * task containers.
 */
import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { LABEL_OWNER, LABEL_TASK_ID, type ContainerEvent } from "./docker-client.js";
import { DOCKER_DEADLINES, TASK_FILTER, type EngineCalls } from "./engine-calls.js";
import {
  LOG_TAIL_FIRST_ENTRIES,
  LOG_TAIL_MAX_BYTES,
  LogTailCollector,
  nextLogTailEntries,
} from "./log-tail.js";

/** Log tails and container events over one {@link EngineCalls}. */
export class EngineStreams {
  constructor(private readonly calls: EngineCalls) {}

  /**
   * The last `lines` lines of a container's output, at most `LOG_TAIL_MAX_BYTES` of it. The
   * answer is read as a stream and only its end kept, and the engine is asked for few entries
   * first, then more (`nextLogTailEntries`) until the tail holds its bytes or every line wanted:
   * a workload that printed hundreds of MB without newlines costs one small read, not a buffer
   * of all its entries (`tail=3000` of such output was 49 MB in memory and on the wire).
   */
  async logTail(id: string, lines: number, signal?: AbortSignal): Promise<string[]> {
    return this.calls.call("logs", DOCKER_DEADLINES.logs, signal, async (abortSignal) => {
      for (
        let entries = Math.min(lines, LOG_TAIL_FIRST_ENTRIES);
        ;
        entries = nextLogTailEntries(entries, lines)
      ) {
        const tail = await this.readLogTail(id, entries, abortSignal);
        if (tail.seen >= LOG_TAIL_MAX_BYTES || entries >= lines)
          return splitLogLines(tail.text()).slice(-lines);
      }
    });
  }

  /** One streamed read of the last `entries` log entries, its end kept (`LogTailCollector`). */
  private async readLogTail(
    id: string,
    entries: number,
    abortSignal: AbortSignal,
  ): Promise<LogTailCollector> {
    const stream = await new Promise<Readable>((resolve, reject) => {
      this.calls.docker.modem.dial(
        {
          path: `/containers/${encodeURIComponent(id)}/logs?`,
          method: "GET",
          isStream: true,
          abortSignal,
          statusCodes: { 200: true, 404: "no such container", 500: "server error" },
          options: { stdout: true, stderr: true, tail: entries },
        },
        (error, result) => (error ? reject(error) : resolve(result as Readable)),
      );
    });
    const collector = new LogTailCollector();
    try {
      for await (const chunk of stream) collector.push(chunk as Buffer);
    } finally {
      stream.destroy();
    }
    return collector;
  }

  /** Follows container events of shim tasks until the signal aborts or the stream drops. */
  async *events(signal: AbortSignal): AsyncIterable<ContainerEvent> {
    const stream = await this.calls.counted(
      "events",
      async () =>
        (await this.calls.docker.getEvents({
          filters: { type: ["container"], ...TASK_FILTER },
          abortSignal: signal,
        })) as Readable,
    );
    const lines = createInterface({ input: stream, crlfDelay: Infinity });
    // readline ends its iteration when its input ends or it is closed, never when the input is
    // destroyed: without the close, a shutdown would wait on this loop forever.
    const onAbort = (): void => {
      lines.close();
      stream.destroy();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const line of lines) {
        const event = parseEvent(line);
        if (event) yield event;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      stream.destroy();
    }
  }
}

/** One line of the engine's event stream → a task container's event; anything else → undefined. */
export function parseEvent(line: string): ContainerEvent | undefined {
  try {
    const raw = JSON.parse(line) as {
      Action?: string;
      Actor?: { ID?: string; Attributes?: Record<string, string> };
    };
    const taskId = raw.Actor?.Attributes?.[LABEL_TASK_ID];
    if (!raw.Action || !raw.Actor?.ID || !taskId) return undefined;
    // Events carry the container's labels as attributes, the owner label included.
    const owner = raw.Actor.Attributes?.[LABEL_OWNER] ?? "";
    const event = { action: raw.Action, containerId: raw.Actor.ID, taskId, owner };
    const exitCode = raw.Actor.Attributes?.exitCode;
    return exitCode !== undefined && /^\d{1,3}$/.test(exitCode)
      ? { ...event, exitCode: Number(exitCode) }
      : event;
  } catch {
    return undefined;
  }
}

/** Splits log text into lines without the trailing empty line. */
export function splitLogLines(text: string): string[] {
  const lines = text.split(/\r?\n/);
  if (lines.at(-1) === "") lines.pop();
  return lines;
}
