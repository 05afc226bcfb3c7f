import { describe, expect, it } from "vitest";
import {
  checkEngineUrl,
  chooseEngineEndpoint,
  DOCKER_DEFAULT_URL,
  EngineUrlError,
  localEngineProbe,
  PODMAN_DEFAULT_URL,
  unreachableMessage,
  type EngineProbe,
} from "./engine-endpoint.js";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { thrown } from "../testing/thrown.js";

/** A host with the given default sockets: present and answering, present and silent, or absent. */
function host(sockets: Record<string, "answers" | "silent">): EngineProbe & { asked: string[] } {
  const asked: string[] = [];
  return {
    asked,
    exists: (url) => {
      asked.push(`exists ${url}`);
      return Promise.resolve(sockets[url] !== undefined);
    },
    answers: (url) => {
      asked.push(`answers ${url}`);
      return Promise.resolve(sockets[url] === "answers");
    },
  };
}

const none = { engineUrl: "", dockerHost: undefined };

describe("chooseEngineEndpoint", () => {
  it("takes --engine-url over DOCKER_HOST, without probing", async () => {
    const probe = host({ [DOCKER_DEFAULT_URL]: "answers" });
    const chosen = await chooseEngineEndpoint(
      { engineUrl: "unix:///run/taskshim-podman/podman.sock", dockerHost: "tcp://127.0.0.1:2375" },
      probe,
    );
    expect(chosen).toEqual({
      url: "unix:///run/taskshim-podman/podman.sock",
      source: "engine-url",
      tried: ["unix:///run/taskshim-podman/podman.sock"],
    });
    expect(probe.asked).toEqual([]);
  });

  it("takes DOCKER_HOST when no --engine-url is given, without probing", async () => {
    const probe = host({});
    expect(
      await chooseEngineEndpoint({ engineUrl: "", dockerHost: "unix:///tmp/pm/podman.sock" }, probe),
    ).toEqual({
      url: "unix:///tmp/pm/podman.sock",
      source: "DOCKER_HOST",
      tried: ["unix:///tmp/pm/podman.sock"],
    });
    expect(probe.asked).toEqual([]);
  });

  it("ignores an empty DOCKER_HOST", async () => {
    const chosen = await chooseEngineEndpoint({ engineUrl: "", dockerHost: "  " }, host({}));
    expect(chosen.source).not.toBe("DOCKER_HOST");
  });

  it("takes Docker's socket when it answers, even with Podman's answering too", async () => {
    const probe = host({ [DOCKER_DEFAULT_URL]: "answers", [PODMAN_DEFAULT_URL]: "answers" });
    expect(await chooseEngineEndpoint(none, probe)).toEqual({
      url: DOCKER_DEFAULT_URL,
      source: "docker-default",
      tried: [DOCKER_DEFAULT_URL],
    });
    expect(probe.asked).toEqual([`answers ${DOCKER_DEFAULT_URL}`]);
  });

  it("takes Podman's rootful socket when there is no Docker socket and Podman answers", async () => {
    expect(await chooseEngineEndpoint(none, host({ [PODMAN_DEFAULT_URL]: "answers" }))).toEqual({
      url: PODMAN_DEFAULT_URL,
      source: "podman-default",
      tried: [DOCKER_DEFAULT_URL, PODMAN_DEFAULT_URL],
    });
  });

  it("stays on a Docker socket that exists but does not answer (a dockerd restarting)", async () => {
    const probe = host({ [DOCKER_DEFAULT_URL]: "silent", [PODMAN_DEFAULT_URL]: "answers" });
    expect(await chooseEngineEndpoint(none, probe)).toEqual({
      url: DOCKER_DEFAULT_URL,
      source: "docker-default",
      tried: [DOCKER_DEFAULT_URL],
    });
    expect(probe.asked).not.toContain(`answers ${PODMAN_DEFAULT_URL}`);
  });

  it("falls back to Docker's socket, naming both, when neither answers", async () => {
    for (const sockets of [{}, { [PODMAN_DEFAULT_URL]: "silent" as const }]) {
      expect(await chooseEngineEndpoint(none, host(sockets))).toEqual({
        url: DOCKER_DEFAULT_URL,
        source: "docker-default",
        tried: [DOCKER_DEFAULT_URL, PODMAN_DEFAULT_URL],
      });
    }
  });
});

describe("checkEngineUrl", () => {
  it("accepts unix sockets by absolute path and tcp host:port", () => {
    for (const url of [
      "unix:///var/run/docker.sock",
      "unix:///run/taskshim-podman/podman.sock",
      "tcp://127.0.0.1:2375",
      "tcp://docker.internal:2376/",
      "tcp://[::1]:2375",
    ]) {
      expect(checkEngineUrl(url)).toBe(url);
    }
    expect(checkEngineUrl(" unix:///var/run/docker.sock ")).toBe("unix:///var/run/docker.sock");
  });

  it("refuses anything else, naming the value and the forms it takes", () => {
    for (const url of [
      "/var/run/docker.sock",
      "unix://relative.sock",
      "unix://",
      "tcp://127.0.0.1",
      "tcp://127.0.0.1:0",
      "tcp://127.0.0.1:65536",
      "http://127.0.0.1:2375",
      "ssh://host",
    ]) {
      const error = thrown(() => checkEngineUrl(url));
      expect(error).toBeInstanceOf(EngineUrlError);
      expect(error.message).toContain(JSON.stringify(url));
      expect(error.message).toMatch(/expected unix:\/\/\//);
    }
  });
});

describe("unreachableMessage", () => {
  it("names the one address when only one was tried (DOCKER_HOST, --engine-url, a Docker socket)", () => {
    expect(
      unreachableMessage(
        {
          url: "unix:///nonexistent/docker.sock",
          source: "DOCKER_HOST",
          tried: ["unix:///nonexistent/docker.sock"],
        },
        "ping: connect ENOENT",
      ),
    ).toBe("docker engine unreachable (unix:///nonexistent/docker.sock): ping: connect ENOENT");
  });

  it("names both default sockets when neither answered", () => {
    expect(
      unreachableMessage(
        {
          url: DOCKER_DEFAULT_URL,
          source: "docker-default",
          tried: [DOCKER_DEFAULT_URL, PODMAN_DEFAULT_URL],
        },
        "ping: connect ENOENT /var/run/docker.sock",
      ),
    ).toBe(
      "docker engine unreachable (unix:///var/run/docker.sock; also tried unix:///run/podman/podman.sock; see --engine-url): ping: connect ENOENT /var/run/docker.sock",
    );
  });
});

describe("localEngineProbe", () => {
  it("sees any file at a unix:// path, nothing at a missing one or a tcp:// URL, and an answer by the ping", async () => {
    const dir = await mkdtemp(join(tmpdir(), "engine-probe-"));
    try {
      await writeFile(join(dir, "docker.sock"), "");
      const pinged: string[] = [];
      const probe = localEngineProbe((url) => {
        pinged.push(url);
        return url.includes("docker") ? Promise.resolve() : Promise.reject(new Error("ECONNREFUSED"));
      });
      expect(await probe.exists(`unix://${join(dir, "docker.sock")}`)).toBe(true);
      expect(await probe.exists(`unix://${join(dir, "podman.sock")}`)).toBe(false);
      expect(await probe.exists("tcp://127.0.0.1:2375")).toBe(false);
      expect(await probe.answers("unix:///x/docker.sock")).toBe(true);
      expect(await probe.answers("unix:///x/podman.sock")).toBe(false);
      expect(pinged).toEqual(["unix:///x/docker.sock", "unix:///x/podman.sock"]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
