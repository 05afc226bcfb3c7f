import { describe, expect, it } from "vitest";
import type { ContainerSpec } from "./docker-client.js";
import { engineCreateBody } from "./engine-create-body.js";
import { plainContainerSpec } from "../testing/container-specs.js";

/** A spec that asks for every field the shim can decide. */
const FULL: ContainerSpec = plainContainerSpec({
  name: "job-1",
  image: "docker.io/library/ubuntu:22.04",
  entrypoint: ["/bin/sh", "-c"],
  cmd: ["exec runner"],
  env: ["A=b", "HABANA_VISIBLE_DEVICES=0"],
  user: "root",
  labels: { "ai.dstack.shim.is-task": "true", "ai.dstack.shim.task-id": "t-1" },
  networkMode: "bridge",
  exposedPorts: [10999, 10022],
  publishedPorts: [10999, 10022],
  privileged: true,
  mounts: [
    { source: "/r", target: "/tmp/runner" },
    { source: "/mnt/v/data", target: "/data" },
  ],
  devices: [{ pathOnHost: "/tmp/kfd", pathInContainer: "/dev/kfd", cgroupPermissions: "rwm" }],
  gpuRequests: [{ deviceIds: ["GPU-a"], capabilities: [["gpu", "utility"]] }],
  capAdd: ["SYS_PTRACE"],
  securityOpt: ["seccomp=unconfined"],
  ipcMode: "host",
  runtime: "habana",
  shmSize: 4096,
  cpus: 1.5,
  memory: 1024,
  memlockUnlimited: true,
});

describe("engineCreateBody", () => {
  it("maps every field of a spec to the Engine API's create body", () => {
    expect(engineCreateBody(FULL)).toEqual({
      Image: "docker.io/library/ubuntu:22.04",
      Entrypoint: ["/bin/sh", "-c"],
      Cmd: ["exec runner"],
      Env: ["A=b", "HABANA_VISIBLE_DEVICES=0"],
      User: "root",
      ExposedPorts: { "10999/tcp": {}, "10022/tcp": {} },
      Labels: { "ai.dstack.shim.is-task": "true", "ai.dstack.shim.task-id": "t-1" },
      HostConfig: {
        Privileged: true,
        NetworkMode: "bridge",
        PortBindings: {
          "10999/tcp": [{ HostIp: "127.0.0.1", HostPort: "" }],
          "10022/tcp": [{ HostIp: "127.0.0.1", HostPort: "" }],
        },
        Mounts: [
          { Type: "bind", Source: "/r", Target: "/tmp/runner" },
          { Type: "bind", Source: "/mnt/v/data", Target: "/data" },
        ],
        RestartPolicy: { Name: "no" },
        AutoRemove: false,
        ShmSize: 4096,
        Tmpfs: { "/dev/shm": "exec,size=4096" },
        NanoCpus: 1_500_000_000,
        Memory: 1024,
        Devices: [{ PathOnHost: "/tmp/kfd", PathInContainer: "/dev/kfd", CgroupPermissions: "rwm" }],
        Ulimits: [{ Name: "memlock", Soft: -1, Hard: -1 }],
        DeviceRequests: [{ DeviceIDs: ["GPU-a"], Capabilities: [["gpu", "utility"]] }],
        CapAdd: ["SYS_PTRACE"],
        SecurityOpt: ["seccomp=unconfined"],
        IpcMode: "host",
        Runtime: "habana",
      },
    });
  });

  it("leaves out what a spec asks nothing of, so the engine applies its own default", () => {
    expect(engineCreateBody(plainContainerSpec({ networkMode: "host", exposedPorts: [10999] }))).toEqual({
      Image: "busybox",
      Entrypoint: ["true"],
      Cmd: [],
      Env: [],
      User: "",
      ExposedPorts: { "10999/tcp": {} },
      Labels: {},
      HostConfig: {
        Privileged: false,
        NetworkMode: "host",
        Mounts: [],
        RestartPolicy: { Name: "no" },
        AutoRemove: false,
      },
    });
  });

  it("sends a CDI request with its driver and without capabilities", () => {
    const cdi = plainContainerSpec({
      gpuRequests: [{ driver: "cdi", deviceIds: ["nvidia.com/gpu=GPU-a"], capabilities: [] }],
    });
    expect(engineCreateBody(cdi).HostConfig?.DeviceRequests).toEqual([
      { Driver: "cdi", DeviceIDs: ["nvidia.com/gpu=GPU-a"] },
    ]);
  });

  it("rounds fractional CPUs to whole nano-CPUs", () => {
    expect(engineCreateBody(plainContainerSpec({ cpus: 0.3333333333 })).HostConfig?.NanoCpus).toBe(
      333_333_333,
    );
  });

  it("copies the spec's lists: the body shares nothing with the spec it came from", () => {
    const body = engineCreateBody(FULL);
    expect(body.Env).not.toBe(FULL.env);
    expect(body.Cmd).not.toBe(FULL.cmd);
    expect(body.Labels).not.toBe(FULL.labels);
    expect(body.HostConfig?.DeviceRequests?.[0]?.DeviceIDs).not.toBe(FULL.gpuRequests[0]?.deviceIds);
  });
});
