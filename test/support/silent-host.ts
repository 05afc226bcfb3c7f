import { createServer, type Socket } from "node:net";

/** A TCP host on 127.0.0.1 that accepts connections and never says a word (no SSH banner). */
export interface SilentHost {
  readonly port: number;
  /** How many connections it has accepted. */
  accepted(): number;
  /** Drops every connection it accepted and stops listening. */
  close(): void;
}

/** Starts a {@link SilentHost}: what an SSH client meets on a host whose sshd hangs. */
export async function startSilentHost(): Promise<SilentHost> {
  const sockets: Socket[] = [];
  const server = createServer((socket) => sockets.push(socket));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  return {
    port: typeof address === "object" && address ? address.port : 0,
    accepted: () => sockets.length,
    close: () => {
      for (const socket of sockets) socket.destroy();
      server.close();
    },
  };
}
