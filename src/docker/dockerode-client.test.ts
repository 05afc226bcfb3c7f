import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { LABEL_CDI_DEVICES, LABEL_TASK_ID, type ContainerSpec } from "./docker-client.js";
import {
  mapDockerError,
  DockerConflictError,
  DockerNotFoundError,
  DockerUnavailableError,
} from "./docker-errors.js";
import { DockerodeClient } from "./dockerode-client.js";
import { engineCreateBody } from "./engine-create-body.js";
import { EngineGpuUnsupportedError } from "./gpu-devices.js";
import { DOCKER_20_10_VERSION, PODMAN_4_3_1_VERSION } from "../testing/engine-versions.js";
import { plainContainerSpec } from "../testing/container-specs.js";
import { rejected } from "../testing/thrown.js";

describe("mapDockerError", () => {
  it("maps status codes to typed errors with the engine's message", () => {
    const notFound = mapDockerError(
      { statusCode: 404, json: { message: "No such container: x" } },
      "inspect",
    );
    expect(notFound).toBeInstanceOf(DockerNotFoundError);
    expect(notFound.message).toBe("inspect: No such container: x");
    expect(mapDockerError({ statusCode: 409, json: { message: "conflict" } }, "create")).toBeInstanceOf(
      DockerConflictError,
    );
  });

  it("reads the message of a streamed call from the error text", () => {
    const error = Object.assign(
      new Error("(HTTP code 500) server error - Head https://r/v2/x: unauthorized: authentication required "),
      { statusCode: 500, reason: "server error", json: null },
    );
    expect(mapDockerError(error, "pull").message).toBe(
      "pull: Head https://r/v2/x: unauthorized: authentication required",
    );
  });

  it("treats a connection failure or an abort as an unavailable engine", () => {
    expect(
      mapDockerError(Object.assign(new Error("connect ENOENT"), { code: "ENOENT" }), "ping"),
    ).toBeInstanceOf(DockerUnavailableError);
    const abort = Object.assign(new Error("aborted"), { name: "AbortError" });
    expect(mapDockerError(abort, "list").message).toContain("deadline exceeded or cancelled");
  });
});

describe("containerEvents", () => {
  it("ends its iteration when its signal aborts, on a stream the engine never ends", async () => {
    const event = {
      Action: "die",
      Actor: { ID: "c1", Attributes: { [LABEL_TASK_ID]: "t1", exitCode: "3" } },
    };
    const server = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write(`${JSON.stringify(event)}\n`);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const { port } = server.address() as AddressInfo;
      const client = new DockerodeClient({ host: "127.0.0.1", port, protocol: "http" });
      const controller = new AbortController();
      const seen: string[] = [];
      const iteration = (async () => {
        for await (const e of client.containerEvents(controller.signal)) {
          seen.push(`${e.taskId} ${e.action} ${e.exitCode}`);
          controller.abort();
        }
        return "ended";
      })();
      const outcome = await Promise.race([iteration, sleep(2_000).then(() => "still waiting")]);
      expect(outcome).toBe("ended");
      expect(seen).toEqual(["t1 die 3"]);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

/** An engine on a local port that answers /version and records create bodies. */
/** An answer of the fake engine to one request: its status and JSON body. */
type FakeAnswer = { readonly status: number; readonly body?: unknown };

async function fakeEngine(
  version: object,
  answer?: (method: string, path: string) => FakeAnswer | undefined,
) {
  const requests: { method: string; path: string; body: Record<string, unknown> }[] = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (chunk: Buffer) => (raw += chunk.toString()));
    req.on("end", () => {
      const path = (req.url ?? "").replace(/\?.*$/, "");
      requests.push({
        method: req.method ?? "",
        path,
        body: raw ? (JSON.parse(raw) as Record<string, unknown>) : {},
      });
      const given = answer?.(req.method ?? "", path);
      if (given !== undefined) {
        res.writeHead(given.status, { "content-type": "application/json" });
        res.end(given.body === undefined ? "" : JSON.stringify(given.body));
        return;
      }
      res.writeHead(path.endsWith("/create") ? 201 : 200, { "content-type": "application/json" });
      res.end(JSON.stringify(path === "/version" ? version : { Id: "c0ffee", Warnings: [] }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    requests,
    client: new DockerodeClient({ host: "127.0.0.1", port, protocol: "http" }),
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

const gpuSpec = (overrides: Partial<ContainerSpec>): ContainerSpec =>
  plainContainerSpec({
    name: "t1",
    image: "bb",
    labels: { [LABEL_TASK_ID]: "t1" },
    networkMode: "host",
    ...overrides,
  });
const NVIDIA_REQUEST = { gpuRequests: [{ deviceIds: ["GPU-a"], capabilities: [["gpu", "utility"]] }] };

describe("detectEngine", () => {
  it("names the engine from GET /version", async () => {
    const engine = await fakeEngine(PODMAN_4_3_1_VERSION);
    try {
      expect(await engine.client.detectEngine()).toEqual({
        info: { kind: "podman", version: "4.3.1", apiVersion: "1.41" },
        recognized: true,
      });
      expect(engine.requests.map((r) => `${r.method} ${r.path}`)).toEqual(["GET /version"]);
    } finally {
      await engine.close();
    }
  });
});

describe("createContainer on each engine", () => {
  it("sends Docker the NVIDIA device request as the spec built it", async () => {
    const engine = await fakeEngine(DOCKER_20_10_VERSION);
    try {
      const spec = gpuSpec(NVIDIA_REQUEST);
      expect(await engine.client.createContainer(spec)).toBe("c0ffee");
      const create = engine.requests.find((r) => r.path.endsWith("/create"));
      expect(create?.body).toEqual({ ...engineCreateBody(spec), name: "t1" });
      expect(create?.body.HostConfig).toMatchObject({
        DeviceRequests: [{ DeviceIDs: ["GPU-a"], Capabilities: [["gpu", "utility"]] }],
      });
    } finally {
      await engine.close();
    }
  });

  it("sends Podman 5.5 the GPUs as one CDI request, and labels the container with their names", async () => {
    const engine = await fakeEngine({
      ...PODMAN_4_3_1_VERSION,
      Components: [{ Name: "Podman Engine", Version: "5.5.2" }],
    });
    try {
      await engine.client.createContainer(gpuSpec(NVIDIA_REQUEST));
      await engine.client.createContainer(gpuSpec(NVIDIA_REQUEST));
      // The engine is asked once; the answer is kept for the creates that follow.
      expect(engine.requests.map((r) => `${r.method} ${r.path}`)).toEqual([
        "GET /version",
        "POST /containers/create",
        "POST /containers/create",
      ]);
      const body = engine.requests[1]?.body;
      const asBuilt = engineCreateBody(gpuSpec(NVIDIA_REQUEST));
      // Only the GPUs differ from Docker's body: one CDI request (no capabilities) and its label.
      expect(body).toEqual({
        ...asBuilt,
        name: "t1",
        Labels: { [LABEL_TASK_ID]: "t1", [LABEL_CDI_DEVICES]: "nvidia.com/gpu=GPU-a" },
        HostConfig: {
          ...asBuilt.HostConfig,
          DeviceRequests: [{ Driver: "cdi", DeviceIDs: ["nvidia.com/gpu=GPU-a"] }],
        },
      });
    } finally {
      await engine.close();
    }
  });

  it("refuses GPUs on Podman 4.3.1 before anything is created", async () => {
    const engine = await fakeEngine(PODMAN_4_3_1_VERSION);
    try {
      const error = await rejected(engine.client.createContainer(gpuSpec(NVIDIA_REQUEST)));
      expect(error).toBeInstanceOf(EngineGpuUnsupportedError);
      expect(engine.requests.map((r) => r.path)).toEqual(["/version"]);
    } finally {
      await engine.close();
    }
  });

  it("asks no engine which it is for a container without GPUs", async () => {
    const engine = await fakeEngine(PODMAN_4_3_1_VERSION);
    try {
      const spec = gpuSpec({
        devices: [{ pathOnHost: "/dev/kfd", pathInContainer: "/dev/kfd", cgroupPermissions: "rwm" }],
      });
      await engine.client.createContainer(spec);
      expect(engine.requests.map((r) => r.path)).toEqual(["/containers/create"]);
      expect(engine.requests[0]?.body).toEqual({ ...engineCreateBody(spec), name: "t1" });
    } finally {
      await engine.close();
    }
  });
});

/** An inspect answer with just what `inspectContainer` reads. */
const inspected = (status: string, exitCode: number) => ({
  Id: "c0ffee",
  Name: "/t1",
  Config: { Labels: {} },
  State: { Status: status, ExitCode: exitCode, OOMKilled: false, Error: "", StartedAt: "", FinishedAt: "" },
  RestartCount: 0,
  NetworkSettings: { Ports: {} },
  HostConfig: {},
});

describe("stopContainer on each engine", () => {
  it("on Podman, answers once the container is no longer `stopping`, whose exit code is not yet read", async () => {
    let inspects = 0;
    const engine = await fakeEngine(PODMAN_4_3_1_VERSION, (method, path) => {
      if (path === "/containers/c0ffee/stop") return { status: 304 };
      if (path !== "/containers/c0ffee/json") return undefined;
      inspects += 1;
      return { status: 200, body: inspects < 3 ? inspected("stopping", 0) : inspected("stopped", 137) };
    });
    try {
      await engine.client.detectEngine();
      await engine.client.stopContainer("c0ffee", 0);
      expect(inspects).toBe(3);
      expect(await engine.client.inspectContainer("c0ffee")).toMatchObject({
        state: "exited",
        exitCode: 137,
      });
    } finally {
      await engine.close();
    }
  });

  it("on Docker, answers with the stop alone (Docker answers once the container has stopped)", async () => {
    const engine = await fakeEngine(DOCKER_20_10_VERSION, (_method, path) =>
      path === "/containers/c0ffee/stop" ? { status: 204 } : undefined,
    );
    try {
      await engine.client.detectEngine();
      await engine.client.stopContainer("c0ffee", 0);
      expect(engine.requests.map((r) => `${r.method} ${r.path}`)).toEqual([
        "GET /version",
        "POST /containers/c0ffee/stop",
      ]);
    } finally {
      await engine.close();
    }
  });
});
