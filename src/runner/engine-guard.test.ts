import { describe, expect, it } from "vitest";
import type { EngineFingerprint } from "../docker/engine-fingerprint.js";
import { capturingLogger } from "../testing/capturing-logger.js";
import { plainContainerSpec } from "../testing/container-specs.js";
import { FakeDockerClient } from "../testing/fake-docker-client.js";
import { EngineGuard, EngineMismatchError, GuardedDockerClient } from "./engine-guard.js";

/*
 * The fake engine (FakeDockerClient) stands in for the Engine API; which engine answers is a
 * variable the test swaps, as Docker stopped and Podman served on the same socket would.
 */
const DOCKER: EngineFingerprint = { kind: "docker", id: "2XPC:EZGC", rootDir: "/var/lib/docker" };
const PODMAN: EngineFingerprint = { kind: "podman", id: "", rootDir: "/var/lib/containers/storage" };

function setup(bound: EngineFingerprint | undefined) {
  let answering = DOCKER;
  const recorded: EngineFingerprint[] = [];
  const { log, lines } = capturingLogger();
  const guard = new EngineGuard(
    { fingerprint: () => Promise.resolve(answering) },
    bound,
    (engine) => {
      recorded.push(engine);
      return Promise.resolve();
    },
    log,
  );
  const fake = new FakeDockerClient();
  return {
    guard,
    fake,
    docker: new GuardedDockerClient(fake, guard),
    recorded,
    lines,
    answer: (engine: EngineFingerprint) => (answering = engine),
  };
}

describe("GuardedDockerClient", () => {
  it("believes an absence from the bound engine", async () => {
    const { docker, guard } = setup(DOCKER);
    expect(await docker.inspectContainer("gone")).toBeUndefined();
    expect(await docker.removeContainer("gone")).toBe("already-absent");
    expect(guard.state().state).toBe("bound");
  });

  it("refuses an absence from another engine, and says so once", async () => {
    const { docker, guard, answer, lines } = setup(DOCKER);
    answer(PODMAN);
    await expect(docker.inspectContainer("gone")).rejects.toThrow(EngineMismatchError);
    await expect(docker.removeContainer("gone")).rejects.toThrow(
      /podman \(\/var\/lib\/containers\/storage\), not this home's docker/,
    );
    expect(guard.state()).toMatchObject({ state: "mismatch", engine: DOCKER, seen: PODMAN });
    expect(lines.filter((l) => l.includes("the engine changed under the shim"))).toHaveLength(1);
    // The bound engine back: absences count again.
    answer(DOCKER);
    await guard.verify();
    expect(await docker.inspectContainer("gone")).toBeUndefined();
    expect(guard.state().state).toBe("bound");
  });

  it("creates no container on another engine", async () => {
    const { docker, fake, answer } = setup(DOCKER);
    answer(PODMAN);
    await expect(docker.createContainer(plainContainerSpec({ name: "t" }))).rejects.toThrow(
      EngineMismatchError,
    );
    expect(fake.containers.size).toBe(0);
  });

  it("binds an unbound home to the engine of its first container, once", async () => {
    const { docker, recorded, guard } = setup(undefined);
    // Nothing to compare with yet: an absence is what the engine says.
    expect(await docker.inspectContainer("gone")).toBeUndefined();
    expect(recorded).toEqual([]);
    await docker.createContainer(plainContainerSpec({ name: "a" }));
    await docker.createContainer(plainContainerSpec({ name: "b" }));
    expect(recorded).toEqual([DOCKER]);
    expect(guard.state()).toEqual({ state: "bound", engine: DOCKER });
  });

  it("does not believe an absence it cannot check (the engine's identity unreadable)", async () => {
    const { log } = capturingLogger();
    const guard = new EngineGuard(
      { fingerprint: () => Promise.reject(new Error("GET /info: timeout")) },
      DOCKER,
      () => Promise.resolve(),
      log,
    );
    const docker = new GuardedDockerClient(new FakeDockerClient(), guard);
    await expect(docker.inspectContainer("gone")).rejects.toThrow(
      /cannot confirm the engine.*GET \/info: timeout/,
    );
  });
});
