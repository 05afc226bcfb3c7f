import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { Server as NetServer, type Socket } from "node:net";

/** How long a shutting-down server keeps its open connections (docs/api.md, "Limits"). */
export interface DrainTimes {
  /**
   * A connection with no request in progress is closed once it has stayed so this long after the
   * drain began (or after its last answer). Long enough for the requests already written by a
   * client (and waiting, unread, while the shutdown kept the event loop busy) to be read and
   * answered; short, because the next shim cannot start before this one has exited.
   */
  readonly idleGraceMs: number;
  /** Whatever is still open after this is closed (a request that never completes, a slow body). */
  readonly deadlineMs: number;
}

export const DRAIN_TIMES: DrainTimes = { idleGraceMs: 250, deadlineMs: 5_000 };

/** Connections this process received from the previous shim (src/shim/connection-handoff.ts). */
const handedOver = new WeakSet<Socket>();

/** Records that `socket` came from the previous shim through the handoff. */
export function receivedByHandoff(socket: Socket): void {
  handedOver.add(socket);
}

/**
 * Whether `socket` came from the previous shim and nothing has been read from it since: for its
 * client, a kept-alive connection between two requests (its parser here is new, and Node treats
 * it as a connection whose first request is late).
 */
export function idleSinceHandoff(socket: Socket): boolean {
  return handedOver.has(socket) && socket.bytesRead === 0;
}

/**
 * Where a draining server's idle connections can go instead of being closed: the next shim, under
 * `taskshim supervise` (src/shim/connection-handoff.ts).
 */
export interface ConnectionHandoff {
  /**
   * Takes an idle connection that has nothing read and unanswered, and ends it in this process
   * without closing it for the client; false when it cannot (the drain then closes it as before).
   */
  give(socket: Socket): boolean;
}

/**
 * Lets an HTTP server go without dropping a request already on its way.
 *
 * Node's `server.close()` stops accepting and at once destroys every connection with no request
 * in progress: a kept-alive connection on which the client has just written its next request (or
 * a connection accepted a moment ago whose request is not parsed yet) counts as idle, and the
 * client gets a reset instead of an answer. Around a restart under `taskshim supervise` or
 * systemd socket activation that was about one request in 6–10 restarts (BENCHMARKS.md, B8/B9).
 * A drain instead stops accepting (new connections wait in the listening socket's backlog for the
 * next shim), answers every request that arrives on an open connection with `Connection: close`
 * (the caller adds the header while {@link draining}), and closes a connection only once it has
 * been idle for {@link DrainTimes.idleGraceMs}.
 *
 * A client that writes its request in the very last instant before the idle close (or that
 * ignores `Connection: close`) can still lose it: HTTP/1.1 cannot close a kept-alive connection
 * without that race; the grace moves it from "whatever arrived while the shutdown was busy" to
 * "a request sent after 250 ms of silence, within one network round trip of the close". With a
 * {@link ConnectionHandoff} the race is gone: an idle connection is not closed but given, open, to
 * the next shim, and what the client writes on it waits in the kernel until that shim reads it.
 */
export class ConnectionDrain {
  /** Every open connection (tracked per connection). */
  readonly #open = new Set<Socket>();
  /**
   * The newest answer of each connection (one WeakMap write per request). With pipelining, Node
   * runs the handlers of requests queued behind a slow one at once and queues their answers: the
   * answer in progress is not the last, and closing after it would drop answers of requests
   * already executed.
   */
  readonly #newest = new WeakMap<Socket, ServerResponse>();
  /** The answers this drain marked `Connection: close` (a later request may move the mark). */
  readonly #marked = new WeakSet<ServerResponse>();
  #state: "serving" | "draining" | "drained" = "serving";
  #times: DrainTimes = DRAIN_TIMES;
  #finish: (() => void) | undefined;

  constructor(
    private readonly server: Server,
    private readonly handoff?: ConnectionHandoff,
  ) {
    server.on("request", (request: IncomingMessage, response: ServerResponse) => {
      const previous = this.#newest.get(request.socket);
      this.#newest.set(request.socket, response);
      if (this.#state === "serving") return;
      // Pipelined behind an answer this drain marked as the last: the mark moves to this one
      // while the earlier answer has not begun (else this one's answer is lost with the close:
      // a read, harmless to repeat, or a change, refused unexecuted while the server drains).
      if (previous && this.#marked.has(previous) && !previous.headersSent) {
        previous.removeHeader("connection");
        this.#marked.delete(previous);
      }
      this.#lastAnswer(response, request.socket);
    });
    server.on("connection", (socket: Socket) => {
      this.#open.add(socket);
      socket.once("close", () => {
        this.#open.delete(socket);
        this.#settleIfEmpty();
      });
      if (this.#state === "draining" && !this.#handOver(socket, this.#betweenMessages())) {
        this.#closeWhenIdle(socket);
      }
    });
  }

  /** True from the start of {@link drain}. */
  get draining(): boolean {
    return this.#state !== "serving";
  }

  /** Open connections (for tests and diagnosis). */
  get openConnections(): number {
    return this.#open.size;
  }

  /**
   * Stops accepting and resolves once every connection is closed: idle ones after the grace,
   * busy ones after their answer (which carries `Connection: close`), and all that remain at the
   * deadline.
   */
  drain(times: DrainTimes = DRAIN_TIMES): Promise<void> {
    if (this.#state !== "serving") return Promise.resolve();
    this.#state = "draining";
    this.#times = times;
    // net.Server's own close: it stops accepting without http.Server#close's immediate
    // closeIdleConnections(), which is the very race this class exists to avoid. (A server that
    // does not listen, as in tests that hand it connections, has nothing to stop.)
    if (this.server.listening) NetServer.prototype.close.call(this.server);
    const done = new Promise<void>((resolve) => (this.#finish = resolve));
    const deadline = setTimeout(() => {
      for (const socket of this.#open) socket.destroy();
    }, times.deadlineMs);
    void done.then(() => clearTimeout(deadline));
    const idle = this.#betweenMessages();
    for (const socket of this.#open) {
      const response = inProgress(socket);
      // The newest answer is the last: those queued behind the one in progress are delivered.
      const newest = this.#newest.get(socket);
      if (response) this.#lastAnswer(newest && !newest.writableFinished ? newest : response, socket);
      else if (!this.#handOver(socket, idle)) this.#closeWhenIdle(socket);
    }
    this.#settleIfEmpty();
    return done;
  }

  /**
   * The answer is its connection's last: Node closes the connection after it. (Already begun
   * without the header, the connection closes once idle for the grace.)
   */
  #lastAnswer(response: ServerResponse, socket: Socket): void {
    if (!response.headersSent) {
      response.setHeader("connection", "close");
      this.#marked.add(response);
    }
    response.once("close", () => this.#closeWhenIdle(socket));
  }

  /**
   * Gives an idle connection to the next shim, if there is a handoff and the connection's parser
   * is between messages (the bytes of a request read in part would be lost with it). What the
   * client wrote that is not read yet is still in the kernel and goes with the descriptor.
   */
  #handOver(socket: Socket, betweenMessages: ReadonlySet<Socket>): boolean {
    if (!this.handoff || socket.destroyed) return false;
    if (!betweenMessages.has(socket) && !idleSinceHandoff(socket)) return false;
    return this.handoff.give(socket);
  }

  /**
   * The connections whose HTTP parser has no message begun: Node's own list of them, the one its
   * `closeIdleConnections()` reads (`http.server.connections`: each parser marks the start of a
   * message at its first byte and clears it when the message is complete). Empty without a
   * handoff (nothing to ask), or when the server does not listen (Node keeps the list from
   * `listening` on).
   */
  #betweenMessages(): ReadonlySet<Socket> {
    if (!this.handoff) return new Set();
    const server = this.server;
    const key = Object.getOwnPropertySymbols(server).find((s) => s.description === "http.server.connections");
    const list =
      key && (server as unknown as Record<symbol, { idle(): { socket: Socket }[] } | undefined>)[key];
    return new Set(list?.idle().map((parser) => parser.socket) ?? []);
  }

  #closeWhenIdle(socket: Socket): void {
    if (socket.destroyed) return;
    // Checked again after the event loop's next poll for I/O (setImmediate runs right after it):
    // a request that reached the kernel by then is read, and its connection is no longer idle.
    // Timers run before that poll, so without this a request that arrived just before the timer
    // fired would still be unread, and destroying the socket would reset it.
    const timer = setTimeout(() => {
      setImmediate(() => {
        if (!inProgress(socket)) socket.destroy();
      });
    }, this.#times.idleGraceMs);
    socket.once("close", () => clearTimeout(timer));
  }

  #settleIfEmpty(): void {
    if (this.#state !== "draining" || this.#open.size > 0) return;
    this.#state = "drained";
    this.#finish?.();
  }
}

/** The answer a connection is writing (Node's own test in `closeIdleConnections`), if any. */
function inProgress(socket: Socket): ServerResponse | undefined {
  const response = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
  return response && !response.writableFinished ? response : undefined;
}
