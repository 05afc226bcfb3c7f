/*
 * B3's physical floor: what any shim must do on a restart before it can answer, and nothing else.
 * It opens the engine's socket and lists the task containers once (the label filter B3's reference
 * uses), reads every task dir's `task.json` of a shim home, binds a port and answers
 * `GET /api/tasks` with each task's status (the container's state over the file's): the answer the
 * B3 client waits for. Node.js builtins only, no dependency and no line of the shim's code, so
 * what B3 spends above it is the shim's own cost.
 *
 * `node b3-floor.cjs <engine URL: unix:///path or tcp://host:port> <shim home> <port>`
 *
 * bench/lib/floor.ts runs it as plain CommonJS, as the shim's bundle is, compiled beforehand:
 * Node's own type stripping costs ~50 ms of every start and its ES module loader ~30 ms (a `.mjs`
 * importing node:http against a `.cjs` requiring it), neither of which a shim pays. Hence
 * node: imports only, and no top-level await (CommonJS has none). Once it has answered it prints, on one line of stdout, its
 * own marks (ms since the process started) and how many task files it read, then exits.
 */
import { readdir, readFile } from "node:fs/promises";
import { createServer, request, type RequestOptions } from "node:http";
import { join } from "node:path";

/** The label of every task container (the shim lists by it). */
const TASK_LABEL = "ai.dstack.shim.is-task=true";

/** What the floor reads of a container list entry. */
interface Listed {
  readonly Names?: readonly string[];
  readonly State?: string;
}

/** One task.json's id and stored status, and its dir's name (the container's name). */
interface Stored {
  readonly name: string;
  readonly id: string;
  readonly status: string;
}

const marks = { script: performance.now(), listed: 0, read: 0, listening: 0, answered: 0, files: 0 };

const [engineUrl, home, portText] = process.argv.slice(2);
if (engineUrl === undefined || home === undefined || portText === undefined) {
  process.stderr.write("usage: node b3-floor.cjs <engine URL> <shim home> <port>\n");
  process.exit(2);
}

/** Where the engine listens, as node:http options. */
function engineAddress(url: string): RequestOptions {
  if (url.startsWith("unix://")) return { socketPath: url.slice("unix://".length) };
  const parsed = new URL(url.replace(/^tcp:/, "http:"));
  return { host: parsed.hostname, port: Number(parsed.port) };
}

/** One `GET /containers/json` of every labelled container, running or not. */
function listTaskContainers(url: string): Promise<Listed[]> {
  const filters = encodeURIComponent(JSON.stringify({ label: [TASK_LABEL] }));
  return new Promise((resolve, reject) => {
    const req = request(
      { ...engineAddress(url), method: "GET", path: `/containers/json?all=1&filters=${filters}` },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("error", reject);
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          if (res.statusCode === 200) resolve(JSON.parse(text) as Listed[]);
          else reject(new Error(`engine list: ${res.statusCode} ${text}`));
        });
      },
    );
    req.on("error", reject);
    req.end();
  });
}

/** Every `<home>/runners/<dir>/task.json`, all read at once (a dir without one is skipped). */
async function readTaskFiles(root: string): Promise<Stored[]> {
  const entries = await readdir(root, { withFileTypes: true }).catch(() => []);
  const read = await Promise.all(
    entries
      .filter((entry) => entry.isDirectory() && !entry.name.startsWith("."))
      .map(async (entry) => {
        const text = await readFile(join(root, entry.name, "task.json"), "utf8").catch(() => undefined);
        if (text === undefined) return undefined;
        const state = JSON.parse(text) as { id?: string; status?: string };
        return { name: entry.name, id: state.id ?? "", status: state.status ?? "" };
      }),
  );
  return read.filter((stored) => stored !== undefined);
}

/** Lists and reads, then binds and answers one request; prints its marks once answered. */
async function main(url: string, shimHome: string, port: number): Promise<void> {
  // The list and the reads in flight together: neither needs the other.
  const [listed, stored] = await Promise.all([
    listTaskContainers(url).finally(() => (marks.listed = performance.now())),
    readTaskFiles(join(shimHome, "runners")).finally(() => (marks.read = performance.now())),
  ]);
  marks.files = stored.length;

  const stateByName = new Map<string, string>();
  for (const container of listed) {
    for (const name of container.Names ?? []) stateByName.set(name.replace(/^\//, ""), container.State ?? "");
  }
  // A task whose container is not running any more is over, whatever its file last said.
  const tasks = stored.map(({ name, id, status }) => ({
    id,
    status: stateByName.get(name) === "running" ? "running" : status === "running" ? "terminated" : status,
  }));
  const body = JSON.stringify({ tasks });

  const server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/json", connection: "close" });
    res.end(body, () => {
      marks.answered = performance.now();
      process.stdout.write(`${JSON.stringify(marks)}\n`);
      server.close();
    });
  });
  server.listen(port, "127.0.0.1", () => (marks.listening = performance.now()));
}

main(engineUrl, home, Number(portText)).catch((error: unknown) => {
  process.stderr.write(
    `b3-floor: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
  );
  process.exit(1);
});
