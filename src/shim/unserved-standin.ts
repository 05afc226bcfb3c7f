import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createServer, type Socket } from "node:net";

/** Set by the inner supervisor for the stand-in it starts: answer 503 on fd 3 until SIGTERM. */
export const STANDIN_ENV = "TASKSHIM_SUPERVISE_STANDIN";

/** The one line a stand-in answers every request with. */
export const UNSERVED_LINE = "no shim is serving: it is restarting or failed to start; try again";

/** How long the stand-in reads a request's head before it answers anyway. */
const HEAD_WAIT_MS = 1_000;

/**
 * The stand-in's own work, in a process of its own: Node accepts on every socket it listens on,
 * and a listening socket closed in the supervisor would be closed for the next shim too. Every
 * connection is answered `503` with one plain-text line and closed. It reads the request's head
 * first, so the client is not reset while it writes. SIGTERM ends it; the socket stays open in
 * the supervisor, and the connections it did not accept wait for the next shim.
 */
export async function serveUnavailable(fd: number): Promise<void> {
  const body = `${UNSERVED_LINE}\n`;
  const answer =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n" +
    `content-length: ${Buffer.byteLength(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n${body}`;
  const server = createServer((socket: Socket) => {
    let head = "";
    const reply = (): void => {
      clearTimeout(timer);
      if (!socket.writable) return;
      socket.end(answer);
    };
    const timer = setTimeout(reply, HEAD_WAIT_MS);
    socket.on("data", (chunk: Buffer) => {
      head += chunk.toString("latin1");
      if (head.includes("\r\n\r\n") || head.length > 16_384) reply();
    });
    socket.on("error", () => socket.destroy());
    socket.on("close", () => clearTimeout(timer));
  });
  server.listen({ fd });
  await once(server, "listening");
  await new Promise<void>((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
  });
  server.close();
}

/**
 * The supervisor's side: while no shim has served for `afterMs`, a stand-in started by `start`
 * answers the held socket's connections, so that clients are told at once instead of waiting in
 * the backlog for minutes (a binary that never serves, a long crash backoff). It is stopped as
 * soon as a shim serves; in between the two may both accept, and a few requests get the 503.
 */
export class UnservedGuard {
  #timer: NodeJS.Timeout | undefined;
  #standIn: ChildProcess | undefined;
  #serving = false;

  constructor(
    private readonly afterMs: number,
    private readonly start: () => ChildProcess,
    private readonly note: (message: string, fields?: Record<string, unknown>) => void,
  ) {}

  /** No shim serves from now on (the supervisor started, a shim exited). */
  unserved(): void {
    this.#serving = false;
    if (this.#timer !== undefined || this.#standIn !== undefined) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (this.#serving) return;
      const standIn = this.start();
      this.#standIn = standIn;
      standIn.once("exit", () => {
        if (this.#standIn === standIn) this.#standIn = undefined;
      });
      standIn.once("error", () => undefined);
      this.note("no shim has served for a while; answering 503 until one does", { afterMs: this.afterMs });
    }, this.afterMs);
    this.#timer.unref();
  }

  /** A shim serves: the stand-in (if any) stops accepting at once. */
  serving(): void {
    this.#serving = true;
    this.#stop();
  }

  /** The supervisor stops. */
  close(): void {
    this.#serving = true;
    this.#stop();
  }

  #stop(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const standIn = this.#standIn;
    this.#standIn = undefined;
    if (standIn?.exitCode === null && standIn.signalCode === null) standIn.kill("SIGTERM");
  }
}
