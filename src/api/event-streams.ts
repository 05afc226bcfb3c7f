import type { ServerResponse } from "node:http";
import type { Task } from "../tasks/task.js";
import type { TaskStatusChange, TaskStore } from "../tasks/task-store.js";
import { taskEvent } from "../wire/task-answers.js";

/** The bounds of `GET /api/events` (docs/api.md, "GET /api/events"). */
export interface EventStreamLimits {
  /** Streams open at once; one more is answered `503` (`--max-event-streams`). */
  readonly maxStreams: number;
  /**
   * Bytes a follower may leave in the shim's own buffer of its connection (written, not yet taken
   * by the kernel) when the next events are due; more and it is cut off.
   */
  readonly maxBacklogBytes: number;
  /** How long a follower may leave that buffer unread; longer and it is cut off. */
  readonly stallMs: number;
}

/** The default bounds. 100 streams leave 900 of the 1,000 connections to everything else. */
export const EVENT_STREAM_LIMITS: EventStreamLimits = {
  maxStreams: 100,
  maxBacklogBytes: 256 * 1024,
  stallMs: 10_000,
};

/**
 * How long changes gather before they are written: one write per stream carries every change of
 * this window (the fan-out's cost is a write per stream, whatever it carries).
 */
const FLUSH_MS = 50;

/** Roughly how much of the opening snapshot one write carries. */
const SNAPSHOT_CHUNK_BYTES = 64 * 1024;

/** What happened to the streams, for the metrics. */
export interface EventStreamObserver {
  /** The number of open streams changed. */
  open?(count: number): void;
  /** A stream was refused: the cap was reached. */
  refused?(): void;
  /** A stream was cut off (a slow reader). */
  cutOff?(reason: "behind" | "stalled"): void;
}

/** One follower: its response, and where it is (the snapshot still being written, or live). */
interface Follower {
  readonly response: ServerResponse;
  state: "snapshot" | "live" | "ended";
  /** Live events that came during the snapshot, sent once it is written. */
  queued: Buffer[];
  queuedBytes: number;
  stall: NodeJS.Timeout | undefined;
}

/**
 * The event streams of `GET /api/events`, bounded in number, in memory and in time.
 *
 * One store watcher serves every follower: a change is serialized once, when the store makes it
 * (so no status is ever skipped, however short), and written to every stream at most every
 * 50 ms with the other changes of that window — one write per stream, not one per stream per
 * change. The opening snapshot is written with back-pressure (the next part once the socket
 * has taken the last), so a snapshot of any size arrives whole; the live events of the meantime
 * wait for it, up to the backlog bound. A follower that does not read is cut off: its socket is
 * destroyed (not ended), so the client sees an aborted stream, never one that ended as if
 * complete. The kernel's own buffers of a connection are the OS's (net.ipv4.tcp_wmem/tcp_rmem);
 * Node.js cannot set SO_SNDBUF on a TCP socket, so the shim bounds what it adds on top.
 */
export class EventStreams {
  readonly #followers = new Set<Follower>();
  readonly #limits: EventStreamLimits;
  #unwatch: (() => void) | undefined;
  #batch: string[] = [];
  #flushing: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: TaskStore,
    limits: Partial<EventStreamLimits> = {},
    private readonly observer: EventStreamObserver = {},
  ) {
    this.#limits = { ...EVENT_STREAM_LIMITS, ...limits };
  }

  /** Streams open now. */
  get open(): number {
    return this.#followers.size;
  }

  /** The limits in force. */
  get limits(): EventStreamLimits {
    return this.#limits;
  }

  /** Whether one more stream may open; false counts a refusal. */
  admit(): boolean {
    if (this.#followers.size < this.#limits.maxStreams) return true;
    this.observer.refused?.();
    return false;
  }

  /**
   * Serves a stream on `response` (headers not sent yet; the caller has checked {@link admit}):
   * the snapshot of the tasks present, then every change.
   */
  serve(response: ServerResponse): void {
    // Changes made before this snapshot and not yet written belong to the streams already open.
    this.#flush();
    const follower: Follower = { response, state: "snapshot", queued: [], queuedBytes: 0, stall: undefined };
    this.#followers.add(follower);
    this.#unwatch ??= this.store.watch((change) => this.#onChange(change));
    this.observer.open?.(this.#followers.size);
    response.once("close", () => this.#end(follower));
    response.writeHead(200, {
      "content-type": "application/x-ndjson; charset=utf-8",
      "cache-control": "no-store",
    });
    // The follower knows at once it is connected, even with no task to list.
    response.flushHeaders();
    // Frozen snapshots: the list holds the tasks as they are now, serialized as the socket takes them.
    this.#writeSnapshot(follower, this.store.list(), new Date().toISOString());
  }

  /**
   * The shim shuts down: live streams end (a follower connects again to the next shim), a
   * stream still in its snapshot is aborted (ended, it would look complete).
   */
  closeAll(): void {
    this.#flush();
    for (const follower of [...this.#followers]) {
      if (follower.state === "live") {
        this.#end(follower);
        follower.response.end();
      } else {
        this.#cut(follower, undefined);
      }
    }
  }

  #onChange(change: TaskStatusChange): void {
    this.#batch.push(`${JSON.stringify(taskEvent(change))}\n`);
    this.#flushing ??= setTimeout(() => this.#flush(), FLUSH_MS);
  }

  #flush(): void {
    clearTimeout(this.#flushing);
    this.#flushing = undefined;
    if (this.#batch.length === 0) return;
    // Encoded once for every stream (a string would be encoded again by each write).
    const chunk = Buffer.from(this.#batch.join(""));
    this.#batch = [];
    for (const follower of this.#followers) {
      if (follower.state === "live") this.#write(follower, chunk);
      else if (follower.state === "snapshot") {
        follower.queued.push(chunk);
        follower.queuedBytes += chunk.length;
        if (follower.queuedBytes > this.#limits.maxBacklogBytes) this.#cut(follower, "behind");
      }
    }
  }

  #writeSnapshot(follower: Follower, tasks: readonly Task[], time: string): void {
    let next = 0;
    const more = (): void => {
      while (next < tasks.length) {
        if (follower.state !== "snapshot") return;
        let chunk = "";
        for (; next < tasks.length && chunk.length < SNAPSHOT_CHUNK_BYTES; next++) {
          const task = tasks[next] as Task;
          chunk += `${JSON.stringify({ ...taskEvent({ kind: "present", task }), time })}\n`;
        }
        if (!follower.response.write(chunk)) {
          // The rest once the socket has taken this part (or the stall cuts the follower off).
          this.#armStall(follower);
          follower.response.once("drain", more);
          return;
        }
      }
      if (follower.state !== "snapshot") return;
      follower.state = "live";
      const queued = Buffer.concat(follower.queued);
      follower.queued = [];
      follower.queuedBytes = 0;
      if (queued.length > 0) this.#write(follower, queued);
    };
    more();
  }

  #write(follower: Follower, chunk: Buffer): void {
    const socket = follower.response.socket;
    if (socket === null || socket.destroyed) {
      this.#end(follower);
      return;
    }
    // What is still in the shim's buffer from earlier writes: the follower is that far behind.
    if (socket.writableLength > this.#limits.maxBacklogBytes) {
      this.#cut(follower, "behind");
      return;
    }
    if (!follower.response.write(chunk)) this.#armStall(follower);
  }

  /** A follower that leaves its buffer unread for `stallMs` is cut off. */
  #armStall(follower: Follower): void {
    if (follower.stall !== undefined) return;
    follower.stall = setTimeout(() => this.#cut(follower, "stalled"), this.#limits.stallMs);
    follower.response.once("drain", () => {
      clearTimeout(follower.stall);
      follower.stall = undefined;
    });
  }

  /** Destroys the connection: the client sees the stream aborted, and its buffers are freed. */
  #cut(follower: Follower, reason: "behind" | "stalled" | undefined): void {
    if (follower.state === "ended") return;
    this.#end(follower);
    if (reason !== undefined) this.observer.cutOff?.(reason);
    follower.response.destroy();
    follower.response.socket?.destroy();
  }

  #end(follower: Follower): void {
    if (follower.state === "ended") return;
    follower.state = "ended";
    clearTimeout(follower.stall);
    follower.queued = [];
    this.#followers.delete(follower);
    this.observer.open?.(this.#followers.size);
    if (this.#followers.size === 0) {
      this.#unwatch?.();
      this.#unwatch = undefined;
      this.#batch = [];
    }
  }
}
