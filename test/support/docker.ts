import Docker from "dockerode";

/** Label key put on every container the tests create; the value is always `"1"`. */
export const TEST_LABEL = "taskshim.test";

/** Label the shim puts on the containers it runs for tasks. */
const SHIM_TASK_LABEL = "ai.dstack.shim.is-task";

/** Prefix of the container names the tests give their tasks. */
const TEST_NAME_PREFIX = "tst-";

/** The engines the integration tests run on (the vitest projects `docker` and `podman`). */
export type TestEngine = "docker" | "podman";

/**
 * The engine of this test run: `TASKSHIM_TEST_ENGINE` (the `podman` project sets it beside
 * `DOCKER_HOST`), else Docker. For the few assertions that differ by engine; each says why.
 */
export function testEngine(): TestEngine {
  return process.env.TASKSHIM_TEST_ENGINE === "podman" ? "podman" : "docker";
}

const clients = new Map<string, Docker>();

/**
 * The engine client the integration tests use: `DOCKER_HOST` (unix:// or tcp://, the `podman`
 * project points it at Podman's socket), else the default `/var/run/docker.sock`. One instance
 * per endpoint and test process; `host` names another endpoint (the global setup, which serves
 * both projects from one process).
 */
export function testDocker(host: string | undefined = process.env.DOCKER_HOST): Docker {
  const key = host ?? "";
  let client = clients.get(key);
  if (client === undefined) {
    client = host?.startsWith("unix://")
      ? new Docker({ socketPath: host.slice("unix://".length) })
      : new Docker();
    clients.set(key, client);
  }
  return client;
}

const podmanAnswers = new WeakMap<Docker, Promise<boolean>>();

/**
 * Whether the engine behind a client is Podman (`GET /version`: Components[0].Name), asked once
 * per client. For the global setup, which serves both projects from one process and so cannot
 * go by {@link testEngine}.
 */
export function isPodman(docker: Docker): Promise<boolean> {
  let answer = podmanAnswers.get(docker);
  if (answer === undefined) {
    answer = docker
      .version()
      .then((v) => (v as { Components?: { Name?: string }[] }).Components?.[0]?.Name === "Podman Engine");
    podmanAnswers.set(docker, answer);
  }
  return answer;
}

/** True for a dockerode error that carries the given HTTP status. */
export function hasStatusCode(err: unknown, status: number): boolean {
  return typeof err === "object" && err !== null && (err as { statusCode?: unknown }).statusCode === status;
}

/**
 * Force-remove every test container: those labelled `taskshim.test=1`, and the shim's task containers
 * (`ai.dstack.shim.is-task=true`) whose name starts with `tst-`. Containers that vanish meanwhile are fine.
 */
export async function removeTestContainers(docker: Docker = testDocker()): Promise<void> {
  const [labelled, tasks] = await Promise.all([
    docker.listContainers({ all: true, filters: { label: [`${TEST_LABEL}=1`] } }),
    docker.listContainers({ all: true, filters: { label: [`${SHIM_TASK_LABEL}=true`] } }),
  ]);
  const isTestTask = (names: string[] | undefined): boolean =>
    (names ?? []).some((name) => name.replace(/^\//, "").startsWith(TEST_NAME_PREFIX));
  const ids = new Set([
    ...labelled.map((c) => c.Id),
    ...tasks.filter((c) => isTestTask(c.Names)).map((c) => c.Id),
  ]);
  await Promise.all(
    [...ids].map(async (id) => {
      try {
        await docker.getContainer(id).remove({ force: true, v: true });
      } catch (err) {
        // 404: already gone; 409: removal already in progress.
        if (!hasStatusCode(err, 404) && !hasStatusCode(err, 409)) throw err;
      }
    }),
  );
}

/**
 * Removes the engine's tags named after a throwaway registry's host (`127.0.0.1:PORT/…`): what the
 * registry (or a proxy in front of it) brought onto the engine goes with it, so test runs do not
 * pile up images. Only those names: another user's images are never touched.
 */
export async function removeImagesOf(registryHost: string): Promise<void> {
  const docker = testDocker();
  const tags = (await docker.listImages()).flatMap((image) => image.RepoTags ?? []);
  for (const tag of tags.filter((t) => t.startsWith(`${registryHost}/`))) {
    // Untagged even while a leftover container uses it; 404: gone meanwhile.
    await docker
      .getImage(tag)
      .remove({ force: true })
      .catch((err: unknown) => {
        if (!hasStatusCode(err, 404)) throw err;
      });
  }
}

/** One line of the engine's NDJSON progress stream (pull, push, import). */
export interface ProgressMessage {
  readonly status?: string;
  readonly id?: string;
  readonly progress?: string;
  readonly error?: string;
  readonly errorDetail?: { readonly message?: string };
  readonly [key: string]: unknown;
}

/**
 * Read an NDJSON progress stream to its end and return every message, error lines included.
 * Rejects only when the stream itself fails or a line is not JSON; callers decide what an error line means.
 */
export async function readProgress(stream: NodeJS.ReadableStream): Promise<ProgressMessage[]> {
  const messages: ProgressMessage[] = [];
  let pending = "";
  const take = (line: string): void => {
    if (line.trim() === "") return;
    messages.push(JSON.parse(line) as ProgressMessage);
  };
  for await (const chunk of stream) {
    pending += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    const lines = pending.split("\n");
    pending = lines.pop() ?? "";
    lines.forEach(take);
  }
  take(pending);
  return messages;
}

/** The first error line of a progress stream, if any. */
export function progressError(messages: readonly ProgressMessage[]): string | undefined {
  const failed = messages.find((m) => m.error !== undefined || m.errorDetail !== undefined);
  return failed === undefined
    ? undefined
    : (failed.error ?? failed.errorDetail?.message ?? JSON.stringify(failed));
}

/** Read a progress stream and throw when it carries an error line (dockerode's `followProgress` would not). */
export async function expectProgressOk(
  stream: NodeJS.ReadableStream,
  what: string,
): Promise<ProgressMessage[]> {
  const messages = await readProgress(stream);
  const error = progressError(messages);
  if (error !== undefined) throw new Error(`${what} failed: ${error}`);
  return messages;
}
