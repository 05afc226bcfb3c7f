import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ConfigError } from "../config/shim-config.js";
import type { EngineEndpoint } from "../docker/engine-endpoint.js";
import type { EngineFingerprint } from "../docker/engine-fingerprint.js";
import { loadEngineRecord, writeEngineRecord, type EngineRecord } from "../state/engine-record.js";
import { checkEngineBinding, engineRecordOf, identifyEngine } from "./engine-binding.js";

const DOCKER: EngineFingerprint = { kind: "docker", id: "2XPC:EZGC", rootDir: "/var/lib/docker" };
const PODMAN: EngineFingerprint = { kind: "podman", id: "", rootDir: "/var/lib/containers/storage" };
const DOCKER_URL = "unix:///var/run/docker.sock";
const PODMAN_URL = "unix:///run/podman/podman.sock";
const at = (url: string, source: EngineEndpoint["source"]): EngineEndpoint => ({ url, source, tried: [url] });

let home: string;
let record: EngineRecord;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "taskshim-binding-"));
  record = engineRecordOf(DOCKER, DOCKER_URL);
  await writeEngineRecord(home, record);
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

const check = (current: EngineFingerprint, endpoint: EngineEndpoint, live?: () => Promise<number>) =>
  checkEngineBinding({
    home,
    homeId: "home-1",
    record,
    current,
    endpoint,
    ...(live ? { liveContainers: live } : {}),
  });

describe("checkEngineBinding", () => {
  it("lets an unbound home start anywhere, and the recorded engine start as it is", async () => {
    expect(
      await checkEngineBinding({
        home,
        homeId: "h",
        record: undefined,
        current: PODMAN,
        endpoint: at(PODMAN_URL, "podman-default"),
      }),
    ).toEqual({ kind: "unbound" });
    expect(await check(DOCKER, at(DOCKER_URL, "home-record"))).toEqual({ kind: "same" });
  });

  it("follows the recorded engine to a new address", async () => {
    expect(await check(DOCKER, at("unix:///run/docker.sock", "DOCKER_HOST"))).toEqual({ kind: "same" });
    expect((await loadEngineRecord(home))?.url).toBe("unix:///run/docker.sock");
  });

  it("refuses another engine found without --engine-url, naming both, and writes nothing", async () => {
    for (const source of ["DOCKER_HOST", "podman-default", "home-record"] as const) {
      const refused = check(PODMAN, at(PODMAN_URL, source));
      await expect(refused).rejects.toThrow(ConfigError);
      await expect(refused).rejects.toThrow(
        "this home's containers live on docker 2XPC:EZGC (/var/lib/docker) at unix:///var/run/docker.sock, but unix:///run/podman/podman.sock is podman (/var/lib/containers/storage)",
      );
    }
    expect(await loadEngineRecord(home)).toEqual(record);
  });

  it("moves with --engine-url only when the recorded engine runs none of the home's containers", async () => {
    await expect(check(PODMAN, at(PODMAN_URL, "engine-url"), () => Promise.resolve(2))).rejects.toThrow(
      /2 container\(s\) of this home still run there/,
    );
    await expect(
      check(PODMAN, at(PODMAN_URL, "engine-url"), () => Promise.reject(new Error("connect ENOENT"))),
    ).rejects.toThrow(/cannot be checked for this home's containers \(connect ENOENT\)/);
    expect(await loadEngineRecord(home)).toEqual(record);
    expect(await check(PODMAN, at(PODMAN_URL, "engine-url"), () => Promise.resolve(0))).toEqual({
      kind: "moved",
      from: record,
    });
    expect(await loadEngineRecord(home)).toMatchObject({
      kind: "podman",
      rootDir: PODMAN.rootDir,
      url: PODMAN_URL,
    });
  });
});

describe("identifyEngine", () => {
  it("asks a slow engine again until it says which it is", async () => {
    let asked = 0;
    const source = {
      fingerprint: () =>
        ++asked < 3 ? Promise.reject(new Error("version: deadline exceeded")) : Promise.resolve(DOCKER),
    };
    expect(await identifyEngine(source, new AbortController().signal, 5_000)).toEqual(DOCKER);
    expect(asked).toBe(3);
  });

  it("gives up with the last failure once its time is spent", async () => {
    const source = { fingerprint: () => Promise.reject(new Error("info: deadline exceeded")) };
    await expect(identifyEngine(source, new AbortController().signal, 800)).rejects.toThrow(
      "info: deadline exceeded",
    );
  });
});
