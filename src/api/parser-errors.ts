import type { Socket } from "node:net";
import { idleSinceHandoff } from "./connection-drain.js";

const CLIENT_ERRORS: Readonly<Record<string, readonly [number, string]>> = {
  HPE_HEADER_OVERFLOW: [431, "Request Header Fields Too Large"],
  ERR_HTTP_REQUEST_TIMEOUT: [408, "Request Timeout"],
};

/**
 * Answers what Node's HTTP parser refused (fastify's own handler answers JSON): one plain-text
 * line, then the connection is closed. Nothing is written once an answer has begun.
 */
export function answerClientError(error: Error & { code?: string }, socket: Socket): void {
  const answered = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage
    ?.headersSent;
  if (error.code === "ECONNRESET" || socket.destroyed || !socket.writable || answered === true) {
    socket.destroy();
    return;
  }
  // A connection the previous shim handed over is, for its client, kept alive between two
  // requests; Node times it out as a new connection whose first request is late. A 408 would
  // be read as the answer to the client's next request: it is left to the keep-alive timeout
  // (connection-handoff.ts), which closes it quietly, as it would have before the restart.
  if (error.code === "ERR_HTTP_REQUEST_TIMEOUT" && idleSinceHandoff(socket)) return;
  const [status, reason] = CLIENT_ERRORS[error.code ?? ""] ?? [400, "Bad Request"];
  const body = `${reason}\n`;
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\n` +
      `X-Content-Type-Options: nosniff\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `Connection: close\r\n\r\n${body}`,
  );
}
