import { request, createServer, type Server } from "node:http";
import { setTimeout as sleep } from "node:timers/promises";

/** A registry reached through a throttling proxy, for pulls slow enough to interrupt. */
export interface SlowProxy {
  /** `127.0.0.1:PORT`: use it as the registry part of image references. */
  readonly host: string;
  close(): Promise<void>;
}

/** How the proxy treats blobs beyond slowing them. */
export interface SlowProxyOptions {
  /**
   * Flip the first byte of every blob body longer than this many bytes (layers, not the small
   * image config): the pull draws progress, then fails its digest check, which Docker does not
   * retry.
   */
  readonly corruptBlobsOver?: number;
}

/**
 * Starts an HTTP proxy in front of `target` (`host:port`) that sends blob bodies at about
 * `bytesPerSecond`; everything else passes at full speed.
 */
export async function startSlowProxy(
  target: string,
  bytesPerSecond: number,
  options: SlowProxyOptions = {},
): Promise<SlowProxy> {
  const [targetHost, targetPort] = target.split(":");
  const server: Server = createServer((req, res) => {
    const upstream = request(
      { host: targetHost, port: Number(targetPort), method: req.method, path: req.url, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        if (!req.url?.includes("/blobs/")) {
          answer.pipe(res);
          return;
        }
        const length = Number(answer.headers["content-length"] ?? 0);
        let corrupt = options.corruptBlobsOver !== undefined && length > options.corruptBlobsOver;
        void (async () => {
          const slice = Math.max(1024, Math.floor(bytesPerSecond / 10));
          for await (const received of answer as AsyncIterable<Buffer>) {
            let chunk = received;
            if (corrupt && received.length > 0) {
              chunk = Buffer.from(received);
              chunk[0] = (chunk[0] ?? 0) ^ 0xff;
              corrupt = false;
            }
            for (let offset = 0; offset < chunk.length; offset += slice) {
              if (res.destroyed) return;
              res.write(chunk.subarray(offset, offset + slice));
              await sleep(100);
            }
          }
          res.end();
        })().catch(() => res.destroy());
      },
    );
    upstream.on("error", () => res.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return {
    host: `127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
