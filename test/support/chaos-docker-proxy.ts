import { request, createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { rm } from "node:fs/promises";

/*
 * A shim owns every labelled task container on its engine: at startup it adopts all of them
 * (as legacy tasks when it has no state for them) and finalizes and releases the exited ones.
 * On a real host there is one shim per engine. Here other homes share the engine — earlier
 * scenarios, other test files, other people's benches — and their containers would run through
 * this shim's restore and release (firing `mid-release:*` failpoints on tasks that are not the
 * scenario's). So each scenario's shim talks to the engine through this proxy, which passes
 * every call through unchanged except the container list, from which it drops the containers
 * whose name does not belong to the scenario.
 */

/** A running proxy: `DOCKER_HOST` for the shim, and `stop()`. */
export interface DockerProxy {
  readonly dockerHost: string;
  stop(): Promise<void>;
}

const CONTAINER_LIST = /^\/(v[\d.]+\/)?containers\/json(\?|$)/;

function upstreamSocket(): string {
  const host = process.env.DOCKER_HOST ?? "";
  if (host === "") return "/var/run/docker.sock";
  if (host.startsWith("unix://")) return host.slice("unix://".length);
  throw new Error(`the chaos suite's Docker proxy needs a unix socket engine, not ${host}`);
}

/** Starts a proxy on `socketPath` that lists only containers whose name passes `keep`. */
export async function startDockerProxy(
  socketPath: string,
  keep: (containerName: string) => boolean,
): Promise<DockerProxy> {
  const upstreamPath = upstreamSocket();
  await rm(socketPath, { force: true });
  const server: Server = createServer((req, res) => {
    const filtered = req.method === "GET" && CONTAINER_LIST.test(req.url ?? "");
    const upstream = request(
      { socketPath: upstreamPath, path: req.url, method: req.method, headers: req.headers },
      (up) => {
        if (!filtered || up.statusCode !== 200) {
          res.writeHead(up.statusCode ?? 502, up.headers);
          up.pipe(res);
          return;
        }
        const chunks: Buffer[] = [];
        up.on("data", (chunk: Buffer) => chunks.push(chunk));
        up.on("error", () => res.destroy());
        up.on("end", () => {
          const all = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { Names?: string[] }[];
          const mine = all.filter((c) => (c.Names ?? []).some((n) => keep(n.replace(/^\//, ""))));
          const body = Buffer.from(JSON.stringify(mine));
          const headers: IncomingHttpHeaders = { ...up.headers, "content-length": String(body.length) };
          delete headers["transfer-encoding"];
          res.writeHead(200, headers);
          res.end(body);
        });
      },
    );
    upstream.on("error", () => res.destroy());
    // A client that goes away (a SIGKILLed shim) ends its streams upstream too.
    res.on("close", () => upstream.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(socketPath, () => {
      server.off("error", reject);
      resolve();
    });
  });
  return {
    dockerHost: `unix://${socketPath}`,
    async stop() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(socketPath, { force: true });
    },
  };
}
