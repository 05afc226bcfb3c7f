import { describe, expect, it } from "vitest";
import { describeEngine, fingerprintOf, sameEngine } from "./engine-fingerprint.js";

/* Recorded `GET /info` answers (abridged): Docker 20.10, and Podman 4.3.1, whose ID is new at every request. */
const DOCKER_INFO = {
  ID: "2XPC:EZGC:FOD6:H54K:YJAD:OZ43",
  DockerRootDir: "/var/lib/docker",
  ServerVersion: "20.10.24",
};
const PODMAN_INFO = {
  ID: "e71aed14-da06-406d-9b9e-c28c221809ad",
  DockerRootDir: "/var/lib/containers/storage",
};

describe("engine fingerprints", () => {
  it("identify Docker by its daemon ID and root, Podman by its graph root alone", () => {
    expect(fingerprintOf("docker", DOCKER_INFO)).toEqual({
      kind: "docker",
      id: "2XPC:EZGC:FOD6:H54K:YJAD:OZ43",
      rootDir: "/var/lib/docker",
    });
    expect(fingerprintOf("podman", PODMAN_INFO)).toEqual({
      kind: "podman",
      id: "",
      rootDir: "/var/lib/containers/storage",
    });
  });

  it("tell Docker from Podman, two Dockers apart, and take Podman's next random ID as the same engine", () => {
    const docker = fingerprintOf("docker", DOCKER_INFO);
    const podman = fingerprintOf("podman", PODMAN_INFO);
    expect(sameEngine(docker, podman)).toBe(false);
    expect(sameEngine(docker, fingerprintOf("docker", { ...DOCKER_INFO, ID: "OTHER:DAEMON" }))).toBe(false);
    expect(
      sameEngine(docker, fingerprintOf("docker", { ...DOCKER_INFO, DockerRootDir: "/srv/docker" })),
    ).toBe(false);
    expect(sameEngine(podman, fingerprintOf("podman", { ...PODMAN_INFO, ID: "3e89edac-7481" }))).toBe(true);
  });

  it("refuse an answer without a root, or a Docker without an ID", () => {
    expect(() => fingerprintOf("docker", { ID: "X" })).toThrow(/no DockerRootDir/);
    expect(() => fingerprintOf("docker", { DockerRootDir: "/var/lib/docker", ID: " " })).toThrow(/no ID/);
    expect(() => fingerprintOf("podman", null)).toThrow(/no DockerRootDir/);
  });

  it("describe an engine on one line", () => {
    expect(describeEngine(fingerprintOf("docker", DOCKER_INFO))).toBe(
      "docker 2XPC:EZGC:FOD6:H54K:YJAD:OZ43 (/var/lib/docker)",
    );
    expect(describeEngine(fingerprintOf("podman", PODMAN_INFO))).toBe("podman (/var/lib/containers/storage)");
  });
});
