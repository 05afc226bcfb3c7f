/* Container specs for tests: one without a task, and what an engine reports of a spec. */
import type { ContainerDetails, ContainerSpec } from "../docker/docker-client.js";

/**
 * A spec that asks the engine for nothing beyond its image and program: no mounts, devices,
 * GPUs, ports or limits, on the engine's default network.
 */
export function plainContainerSpec(overrides: Partial<ContainerSpec> = {}): ContainerSpec {
  return {
    name: "t1",
    image: "busybox",
    entrypoint: ["true"],
    cmd: [],
    env: [],
    user: "",
    labels: {},
    networkMode: "bridge",
    exposedPorts: [],
    publishedPorts: [],
    privileged: false,
    mounts: [],
    devices: [],
    gpuRequests: [],
    capAdd: [],
    securityOpt: [],
    shmSize: 0,
    cpus: 0,
    memory: 0,
    memlockUnlimited: false,
    ...overrides,
  };
}

/**
 * The devices and GPU requests an inspect reports of a container created from `spec`: Docker's,
 * the spec as the engine took it (a field the spec leaves empty is absent).
 */
export function inspectedHostConfig(spec: ContainerSpec): ContainerDetails["hostConfig"] {
  return {
    ...(spec.gpuRequests.length > 0
      ? {
          DeviceRequests: spec.gpuRequests.map((request) => ({
            ...(request.driver === undefined ? {} : { Driver: request.driver }),
            DeviceIDs: [...request.deviceIds],
          })),
        }
      : {}),
    ...(spec.devices.length > 0
      ? {
          Devices: spec.devices.map((device) => ({
            PathOnHost: device.pathOnHost,
            PathInContainer: device.pathInContainer,
          })),
        }
      : {}),
  };
}
