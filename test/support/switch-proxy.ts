import { connect, createServer, type Server, type Socket } from "node:net";
import { rm } from "node:fs/promises";

/*
 * An engine socket whose engine can be swapped under a running shim: a Unix socket that pipes
 * every connection to the current upstream socket. `switchTo` cuts the open connections (as an
 * engine restart does) and sends the next ones to another engine: Docker stopped and Podman
 * served on the same path, without touching either engine.
 */
export interface SwitchProxy {
  /** `unix://<path>`, for DOCKER_HOST or --engine-url. */
  readonly url: string;
  switchTo(upstreamPath: string): void;
  stop(): Promise<void>;
}

/** Starts a proxy at `socketPath` in front of `upstreamPath`. */
export async function startSwitchProxy(socketPath: string, upstreamPath: string): Promise<SwitchProxy> {
  let upstream = upstreamPath;
  const open = new Set<Socket>();
  await rm(socketPath, { force: true });
  const server: Server = createServer((client) => {
    const engine = connect(upstream);
    open.add(client).add(engine);
    const close = (): void => {
      open.delete(client);
      open.delete(engine);
      client.destroy();
      engine.destroy();
    };
    client.on("error", close).on("close", close);
    engine.on("error", close).on("close", close);
    client.pipe(engine).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  return {
    url: `unix://${socketPath}`,
    switchTo(path) {
      upstream = path;
      for (const socket of open) socket.destroy();
    },
    async stop() {
      for (const socket of open) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
