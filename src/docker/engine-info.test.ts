import { describe, expect, it } from "vitest";
import {
  ENGINE_REDETECT_MS,
  EngineIdentity,
  parseEngineVersion,
  versionAtLeast,
  versionNumbers,
  type EngineDetection,
  type EngineInfo,
} from "./engine-info.js";
import { DOCKER_20_10_VERSION, PODMAN_4_3_1_VERSION } from "../testing/engine-versions.js";

describe("parseEngineVersion", () => {
  it("names Podman by its Podman Engine component, with its own version, not Docker's fields", () => {
    expect(parseEngineVersion(PODMAN_4_3_1_VERSION)).toEqual({
      info: { kind: "podman", version: "4.3.1", apiVersion: "1.41" },
      recognized: true,
    });
    // The component's version wins over the top-level one (they could differ in a wrapper).
    const wrapped = { ...PODMAN_4_3_1_VERSION, Version: "1.41" };
    expect(parseEngineVersion(wrapped).info.version).toBe("4.3.1");
  });

  it("names Docker by its Engine component", () => {
    expect(parseEngineVersion(DOCKER_20_10_VERSION)).toEqual({
      info: { kind: "docker", version: "20.10.24+dfsg1", apiVersion: "1.41" },
      recognized: true,
    });
  });

  it("takes an older Docker's top-level Version when it lists no components", () => {
    expect(parseEngineVersion({ Version: "1.13.1", ApiVersion: "1.26" })).toEqual({
      info: { kind: "docker", version: "1.13.1", apiVersion: "1.26" },
      recognized: true,
    });
  });

  it("drives an engine it does not recognize as Docker, and says it did not recognize it", () => {
    const other = { Components: [{ Name: "Some Engine", Version: "9.9" }], Version: "9.9" };
    expect(parseEngineVersion(other)).toEqual({
      info: { kind: "docker", version: "9.9" },
      recognized: false,
    });
    expect(parseEngineVersion({})).toEqual({
      info: { kind: "docker", version: "unknown" },
      recognized: false,
    });
    expect(parseEngineVersion("not an object")).toEqual({
      info: { kind: "docker", version: "unknown" },
      recognized: false,
    });
    expect(parseEngineVersion(null).recognized).toBe(false);
  });

  it("skips components that are not objects and versions that are not strings", () => {
    const odd = { Components: [null, 7, { Name: "Podman Engine", Version: 5 }], Version: "5.5.0" };
    expect(parseEngineVersion(odd).info).toEqual({ kind: "podman", version: "5.5.0" });
  });
});

describe("versionAtLeast", () => {
  it("compares major, minor and patch numerically, ignoring suffixes", () => {
    expect(versionNumbers("4.3.1")).toEqual([4, 3, 1]);
    expect(versionNumbers("5.5.0-rc1")).toEqual([5, 5, 0]);
    expect(versionNumbers("v5")).toEqual([5, 0, 0]);
    expect(versionNumbers("unknown")).toBeUndefined();
    expect(versionAtLeast("5.5.0", [5, 5, 0])).toBe(true);
    expect(versionAtLeast("5.10.2", [5, 5, 0])).toBe(true);
    expect(versionAtLeast("6.0", [5, 5, 0])).toBe(true);
    expect(versionAtLeast("5.4.9", [5, 5, 0])).toBe(false);
    expect(versionAtLeast("4.3.1", [5, 5, 0])).toBe(false);
    expect(versionAtLeast("unknown", [0, 0, 0])).toBe(false);
  });
});

/** A version source whose answers the test sets, counting the requests. */
class FakeSource {
  calls = 0;
  answer: EngineDetection | Error = { info: { kind: "docker", version: "20.10.24" }, recognized: true };
  detectEngine(): Promise<EngineDetection> {
    this.calls++;
    const answer = this.answer;
    return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
  }
}

function identity(source: FakeSource, clock = { now: 0 }) {
  const lines: string[] = [];
  const changes: EngineInfo[] = [];
  const engine = new EngineIdentity(source, {
    log: (level, fields, msg) => lines.push(`${level} ${msg} ${JSON.stringify(fields)}`),
    changed: (info) => changes.push(info),
    now: () => clock.now,
  });
  return { engine, lines, changes, clock };
}

const PODMAN: EngineDetection = { info: { kind: "podman", version: "4.3.1" }, recognized: true };

describe("EngineIdentity", () => {
  it("knows nothing before its first detection, and the engine after it", async () => {
    const source = new FakeSource();
    const { engine, changes, lines } = identity(source);
    expect(engine.current()).toBeUndefined();
    expect(await engine.detect()).toEqual({ kind: "docker", version: "20.10.24" });
    expect(engine.current()).toEqual({ kind: "docker", version: "20.10.24" });
    expect(changes).toEqual([{ kind: "docker", version: "20.10.24" }]);
    expect(lines).toEqual([]);
  });

  it("asks once for callers that ask together", async () => {
    const source = new FakeSource();
    const { engine } = identity(source);
    await Promise.all([engine.detect(), engine.detect(), engine.detect()]);
    expect(source.calls).toBe(1);
  });

  it("detects again when the engine comes back after being down, and names a swapped engine", async () => {
    const source = new FakeSource();
    const { engine, changes, lines } = identity(source);
    await engine.detect();
    engine.seen(true);
    expect(source.calls).toBe(1); // up and known: no request
    engine.seen(false);
    expect(source.calls).toBe(1);
    source.answer = PODMAN;
    engine.seen(true);
    await engine.detect(); // shares the request seen() started
    expect(source.calls).toBe(2);
    expect(engine.current()).toEqual({ kind: "podman", version: "4.3.1" });
    expect(changes.map((c) => c.kind)).toEqual(["docker", "podman"]);
    expect(lines).toEqual([
      'info the engine changed {"engineKind":"podman","engineVersion":"4.3.1","was":"docker 20.10.24"}',
    ]);
    engine.seen(true);
    expect(source.calls).toBe(2); // back up once is one detection
  });

  it("reports no change when the same engine comes back", async () => {
    const source = new FakeSource();
    const { engine, changes, lines } = identity(source);
    await engine.detect();
    engine.seen(false);
    engine.seen(true);
    await engine.detect();
    expect(changes).toHaveLength(1);
    expect(lines).toEqual([]);
  });

  it("keeps what it knew when a detection fails, warns once per failing spell, and never throws", async () => {
    const source = new FakeSource();
    const { engine, lines } = identity(source);
    await engine.detect();
    source.answer = new Error("connect ECONNREFUSED");
    expect(await engine.detect()).toEqual({ kind: "docker", version: "20.10.24" });
    expect(await engine.detect()).toEqual({ kind: "docker", version: "20.10.24" });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain("cannot tell which engine this is");
    expect(lines[0]).toContain("ECONNREFUSED");
  });

  it("retries an engine never named while it is up, at most every ENGINE_REDETECT_MS", async () => {
    const source = new FakeSource();
    source.answer = new Error("500 server error");
    const { engine, clock } = identity(source);
    expect(await engine.detect()).toBeUndefined();
    engine.seen(true);
    expect(source.calls).toBe(1);
    clock.now += ENGINE_REDETECT_MS - 1;
    engine.seen(true);
    expect(source.calls).toBe(1);
    clock.now += 1;
    source.answer = PODMAN;
    engine.seen(true);
    await engine.detect();
    expect(source.calls).toBe(2);
    expect(engine.current()?.kind).toBe("podman");
  });

  it("warns when the answer names no engine it knows", async () => {
    const source = new FakeSource();
    source.answer = { info: { kind: "docker", version: "9.9" }, recognized: false };
    const { engine, lines } = identity(source);
    await engine.detect();
    expect(lines).toEqual([
      'warn the engine\'s /version names neither Docker nor Podman; it is driven as the Docker Engine {"engineKind":"docker","engineVersion":"9.9"}',
    ]);
  });
});
