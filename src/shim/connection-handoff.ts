import type { ChildProcess, SendHandle } from "node:child_process";
import type { Server } from "node:http";
import { Socket } from "node:net";
import { idleSinceHandoff, receivedByHandoff, type ConnectionHandoff } from "../api/connection-drain.js";

/*
 * Kept-alive API connections across a restart under `taskshim supervise`.
 *
 * A shim that shuts down would have to close its idle kept-alive connections, and a client that
 * writes its next request on one in the instant it closes loses that request (HTTP/1.1 has no
 * way to close a kept-alive connection without that race). Instead the draining shim sends each
 * idle connection's descriptor to its supervisor over the IPC channel, the supervisor keeps it
 * until the next shim serves and sends it on, and the next shim serves it as if it had accepted
 * it. The client sees one connection that never closed; a request it wrote meanwhile waited in
 * the kernel.
 *
 * What Node.js does not document, and this relies on (pinned Node; the tests would show a change):
 * a socket's `_handle` (its libuv stream), whose `readStop()` keeps the HTTP parser from reading
 * more, and which `process.send` passes as a bare handle (the cluster module's way) so that the
 * supervisor never reads from it; and `new Socket({ handle })` to serve a received one.
 */

/** Set by `supervise` for its shims: the IPC channel takes and gives connections. */
export const HANDOFF_ENV = "TASKSHIM_CONNECTION_HANDOFF";

/** The IPC messages of the handoff: a connection (with its descriptor), or "I serve now". */
type HandoffMessage = { readonly taskshim: "connection" } | { readonly taskshim: "serving" };

const CONNECTION: HandoffMessage = { taskshim: "connection" };
const SERVING: HandoffMessage = { taskshim: "serving" };

/** The libuv stream under a socket, as far as the handoff uses it. */
interface StreamHandle {
  readStop(): number;
  close(): void;
}

function isMessage(message: unknown, kind: HandoffMessage["taskshim"]): boolean {
  return typeof message === "object" && message !== null && (message as HandoffMessage).taskshim === kind;
}

function streamHandle(socket: Socket): StreamHandle | undefined {
  return (socket as Socket & { _handle?: StreamHandle | null })._handle ?? undefined;
}

/** The shim's side: gives its idle connections away when it drains, takes them when it serves. */
export interface ShimHandoff extends ConnectionHandoff {
  /** Serves on `server` the connections the supervisor sends, and tells it this shim serves. */
  accept(server: Server): void;
}

/** The shim's side of the handoff, when a supervisor offers one (undefined otherwise). */
export function shimHandoff(proc: NodeJS.Process = process): ShimHandoff | undefined {
  const send = proc.send?.bind(proc);
  if (proc.env[HANDOFF_ENV] !== "1" || send === undefined) return undefined;
  return {
    give(socket) {
      const handle = streamHandle(socket);
      if (handle === undefined || !proc.connected) return false;
      // From here nothing is read in this process: what the client writes stays in the kernel
      // and goes with the descriptor.
      handle.readStop();
      // Closing this process's descriptor once it is on its way (in the channel, the kernel
      // holds it) neither resets nor ends the connection.
      send(CONNECTION, handle as unknown as SendHandle, { keepOpen: true }, () => socket.destroy());
      return true;
    },
    accept(server) {
      proc.on("message", (message: unknown, handle: unknown) => {
        if (!isMessage(message, "connection") || handle === undefined || handle === null) return;
        serveHandedOver(server, handle as StreamHandle);
      });
      send(SERVING, undefined, {}, () => undefined);
    },
  };
}

/** What net.Server keeps of its connections (internal, stable since Node.js 0.x). */
interface CountedServer {
  _connections: number;
}

/**
 * Serves a connection the previous shim handed over as net.Server serves one it accepts: refused
 * (closed, and counted as a drop) once `maxConnections` are open, else counted among them until
 * it closes, with the server's half-open setting. An emitted "connection" alone bypasses both.
 * Nothing read from it since the handoff, it is idle for its client: closed quietly after the
 * server's keep-alive timeout, as it would have been before the restart.
 */
export function serveHandedOver(server: Server, handle: StreamHandle): void {
  const counted = server as unknown as CountedServer;
  if (Number.isFinite(server.maxConnections) && counted._connections >= server.maxConnections) {
    handle.close();
    server.emit("drop");
    return;
  }
  const options = {
    handle,
    readable: true,
    writable: true,
    allowHalfOpen: (server as Server & { allowHalfOpen?: boolean }).allowHalfOpen === true,
  } as unknown as ConstructorParameters<typeof Socket>[0];
  const socket = new Socket(options);
  // As net.Server#onconnection: the socket's own destroy takes it off the count again.
  counted._connections++;
  Object.assign(socket, { server, _server: server });
  receivedByHandoff(socket);
  if (server.keepAliveTimeout > 0) {
    const idle = setTimeout(() => {
      if (idleSinceHandoff(socket)) socket.destroy();
    }, server.keepAliveTimeout);
    idle.unref();
    socket.once("close", () => clearTimeout(idle));
  }
  server.emit("connection", socket);
}

/**
 * The supervisor's side: keeps the connections a draining shim gives until a shim serves, then
 * sends them to it. One per supervisor, over every shim it starts.
 */
export class HandoffRelay {
  readonly #waiting: StreamHandle[] = [];
  #serving: ChildProcess | undefined;
  #closed = false;

  /** Relays for a shim just started (with an IPC channel). */
  attach(child: ChildProcess): void {
    child.on("message", (message: unknown, handle: unknown) => {
      if (isMessage(message, "serving")) {
        this.#serving = child;
      } else if (isMessage(message, "connection") && handle) {
        // A shim that gives connections away is draining: none goes back to it.
        if (this.#serving === child) this.#serving = undefined;
        this.#waiting.push(handle as StreamHandle);
      }
      if (this.#closed) this.close();
      else this.#flush();
    });
    child.once("exit", () => {
      if (this.#serving === child) this.#serving = undefined;
    });
  }

  /** Connections waiting for a shim. */
  get waiting(): number {
    return this.#waiting.length;
  }

  /** Closes the connections no shim will take, now and from now on (the supervisor is stopping). */
  close(): void {
    this.#closed = true;
    for (const handle of this.#waiting.splice(0)) handle.close();
  }

  #flush(): void {
    const child = this.#serving;
    if (child === undefined) return;
    for (const handle of this.#waiting.splice(0)) {
      // Once the message is written the descriptor is on its way and this copy is closed; one
      // that could not be sent (that shim just ended) waits for the next.
      child.send(CONNECTION, handle as unknown as SendHandle, { keepOpen: true }, (error) => {
        if (error) this.#waiting.push(handle);
        else handle.close();
      });
    }
  }
}
