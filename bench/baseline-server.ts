import { readFileSync } from "node:fs";
import Fastify from "fastify";

/*
 * B5's baseline: a bare fastify app whose routes return constants — the very bodies the shim
 * answered for the same paths, captured just before — so the ratio isolates the shim's own
 * work per request. Run as a child process (`node --import tsx bench/baseline-server.ts
 * <bodies.json>`); prints `{"port":N}` once listening and exits on SIGTERM.
 */

interface Bodies {
  readonly task: unknown;
  readonly tasks: unknown;
}

const bodies = JSON.parse(readFileSync(process.argv[2] ?? "", "utf8")) as Bodies;
const app = Fastify({ logger: false });
app.get("/api/tasks/:id", () => bodies.task);
app.get("/api/tasks", () => bodies.tasks);

await app.listen({ host: "127.0.0.1", port: 0 });
const address = app.server.address();
process.stdout.write(
  `${JSON.stringify({ port: typeof address === "object" && address ? address.port : 0 })}\n`,
);
process.once("SIGTERM", () => void app.close().then(() => process.exit(0)));
