import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { removeContainerViaCli } from "../src/docker/cli-removal.js";
import { DockerodeClient } from "../src/docker/dockerode-client.js";
import { RemovalUnconfirmedError } from "../src/docker/docker-errors.js";
import { OperationBound } from "../src/exec/operation-bound.js";
import {
  BoundedCommandRunner,
  type BoundedOutcome,
  type CommandRequest,
  type CommandRunner,
} from "../src/exec/run-bounded.js";
import { TEST_LABEL, testDocker, testEngine } from "./support/docker.js";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { startSilentHost, type SilentHost } from "./support/silent-host.js";

let images: TestImages;

/** The real BoundedCommandRunner, recording which docker subcommands ran: which branch of the removal was taken. */
class RecordingCommands implements CommandRunner {
  readonly steps: string[] = [];
  private readonly inner = new BoundedCommandRunner();
  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.steps.push(request.argv.includes("inspect") ? "inspect" : "rm");
    return this.inner.run(request);
  }
}

/**
 * A running container with 20,000 files in its writable layer: the engine needs a few hundred
 * milliseconds to remove it (350-1,300 ms measured on this machine), a window in which a second
 * removal is answered "removal of container … is already in progress".
 */
async function slowToRemove(): Promise<string> {
  const container = await testDocker().createContainer({
    Image: images.busybox,
    Cmd: ["sh", "-c", "mkdir /d && cd /d && seq 1 20000 | xargs touch && touch /ready; sleep 300"],
    Labels: { [TEST_LABEL]: "1" },
  });
  await container.start();
  const until = Date.now() + 60_000;
  for (;;) {
    // Attached: Podman refuses an exec start attaching no stream; the output is read to its end.
    const exec = await container.exec({
      Cmd: ["test", "-e", "/ready"],
      AttachStdout: true,
      AttachStderr: true,
    });
    await new Promise<void>((resolve, reject) =>
      exec.start({}, (error, stream) =>
        error ? reject(error as Error) : stream?.on("end", resolve).resume(),
      ),
    );
    if ((await exec.inspect()).ExitCode === 0) return container.id;
    if (Date.now() > until) throw new Error("the container did not write its files within 60 s");
    await sleep(200);
  }
}

/**
 * Races a confirmed removal against another removal of the same slow container, started 30 ms
 * earlier through the Engine API. Returns the result and the branch the confirmed removal took.
 */
async function race(
  remove: (id: string) => Promise<{ result: string; polled: boolean }>,
): Promise<{ result: string; polled: boolean }> {
  const id = await slowToRemove();
  const first = testDocker()
    .getContainer(id)
    .remove({ force: true, v: true })
    .catch((error: unknown) => error);
  await sleep(30);
  const outcome = await remove(id);
  await first;
  await expectGone(id);
  return outcome;
}

/**
 * Up to three rounds, until one took the in-progress branch; in every round the result must match
 * the branch taken (polled ⇒ already absent).
 */
async function expectInProgressBranch(
  remove: (id: string) => Promise<{ result: string; polled: boolean }>,
): Promise<void> {
  const rounds: { result: string; polled: boolean }[] = [];
  while (rounds.length < 3 && !rounds.some((r) => r.polled)) {
    const round = await race(remove);
    if (round.polled) expect(round.result).toBe("already-absent");
    rounds.push(round);
  }
  expect(rounds.filter((r) => r.polled)).toEqual([{ result: "already-absent", polled: true }]);
}

async function expectGone(id: string): Promise<void> {
  await expect(testDocker().getContainer(id).inspect()).rejects.toMatchObject({ statusCode: 404 });
}

beforeAll(async () => {
  images = await ensureTestImages();
});

/**
 * Podman never answers "removal … already in progress": its per-container lock makes a second
 * removal wait for the first and then answer 404 (confirmed already absent at once), so the
 * polling branch cannot be reached there. Docker only (TESTING.md, "Two engines").
 */
const dockerOnly = testEngine() === "podman";

describe("confirmed container removal on the real engine", () => {
  it.skipIf(dockerOnly)(
    "CLI: a removal already in progress is polled until gone, and confirmed already absent",
    async () => {
      await expectInProgressBranch(async (id) => {
        const commands = new RecordingCommands();
        const result = await removeContainerViaCli(commands, id);
        // Polled: rm answered "already in progress", then only inspects until "No such container".
        const polled = commands.steps.length > 1;
        expect(commands.steps[0]).toBe("rm");
        expect(commands.steps.slice(1).every((step) => step === "inspect")).toBe(true);
        return { result, polled };
      });
    },
  );

  it.skipIf(dockerOnly)(
    "Engine API: a removal already in progress is polled until gone, and confirmed already absent",
    async () => {
      await expectInProgressBranch(async (id) => {
        const calls: string[] = [];
        const api = DockerodeClient.fromEnv(undefined, (operation, outcome) =>
          calls.push(`${operation}:${outcome}`),
        );
        const result = await api.removeContainer(id);
        // Polled: the remove failed (409), then only inspects, the last one the 404.
        const polled = calls.length > 1;
        expect(calls[0]).toMatch(/^remove:/);
        expect(calls.slice(1).every((call) => call.startsWith("inspect:"))).toBe(true);
        if (polled) expect(calls.at(-1)).toBe("inspect:error");
        return { result, polled };
      });
    },
  );

  it("a running container is removed by one rm, and a gone one confirmed", async () => {
    const container = await testDocker().createContainer({
      Image: images.busybox,
      Cmd: ["sleep", "300"],
      Labels: { [TEST_LABEL]: "1" },
    });
    await container.start();
    const commands = new RecordingCommands();
    expect(await removeContainerViaCli(commands, container.id)).toBe("removed");
    expect(commands.steps).toEqual(["rm"]);
    await expectGone(container.id);
    // The Engine API says "No such container" for it: confirmed, already absent.
    expect(await DockerodeClient.fromEnv().removeContainer(container.id)).toBe("already-absent");
  });
});

describe("an SSH launch machine that does not answer", () => {
  let silent: SilentHost;
  let port = 0;

  beforeAll(async () => {
    silent = await startSilentHost();
    port = silent.port;
  });

  afterAll(() => silent.close());

  it("ends unconfirmed at the removal deadline, with the killed ssh client's verified evidence", async () => {
    const started = Date.now();
    const error = await removeContainerViaCli(
      new BoundedCommandRunner(),
      "job-1234abcd",
      // ssh's own ConnectTimeout (10 s) is longer than the bound: the bound must end it.
      { kind: "ssh", host: "127.0.0.1", port },
      OperationBound.within(1_500),
    ).catch((e: unknown) => e);
    const elapsed = Date.now() - started;
    expect(error).toBeInstanceOf(RemovalUnconfirmedError);
    const reason = (error as RemovalUnconfirmedError).reason;
    expect(reason).toMatchObject({
      kind: "deadline",
      cleanup: { trigger: "deadline", kill_attempted: true, verified: true, error: null },
    });
    expect(reason.kind === "deadline" && reason.elapsedMs).toBeGreaterThanOrEqual(1_500);
    expect(elapsed).toBeLessThan(1_500 + 1_000);
    expect(silent.accepted()).toBeGreaterThanOrEqual(1);
  });
});
