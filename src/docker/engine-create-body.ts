/*
 * The one mapping of the shim's container spec to the Engine API's create body
 * (POST /containers/create). Pure: the engine's differences are applied to the spec before it
 * (`specForEngine`), so the same spec always gives the same body.
 */
import type Docker from "dockerode";
import type { ContainerSpec, GpuRequest } from "./docker-client.js";

/** A GPU request as the Engine API takes it: a field the request leaves empty is not sent. */
function engineDeviceRequest(request: GpuRequest): Docker.DeviceRequest {
  return {
    ...(request.driver === undefined ? {} : { Driver: request.driver }),
    DeviceIDs: [...request.deviceIds],
    ...(request.capabilities.length > 0 ? { Capabilities: request.capabilities.map((set) => [...set]) } : {}),
  };
}

/**
 * The Engine API's create body of `spec`, without its name (dockerode sends the name as a query
 * parameter). A spec field at its zero value is left out, so the engine applies its own default
 * exactly as it did for the bodies the shim wrote by hand; restart policy "no" and no auto-remove
 * always, as a container's exit code must outlive the shim.
 */
export function engineCreateBody(spec: ContainerSpec): Docker.ContainerCreateOptions {
  const tcp = (port: number): string => `${port}/tcp`;
  return {
    Image: spec.image,
    Entrypoint: [...spec.entrypoint],
    Cmd: [...spec.cmd],
    Env: [...spec.env],
    User: spec.user,
    ExposedPorts: Object.fromEntries(spec.exposedPorts.map((port) => [tcp(port), {}])),
    Labels: { ...spec.labels },
    HostConfig: {
      Privileged: spec.privileged,
      NetworkMode: spec.networkMode,
      ...(spec.publishedPorts.length > 0
        ? {
            PortBindings: Object.fromEntries(
              spec.publishedPorts.map((port) => [tcp(port), [{ HostIp: "127.0.0.1", HostPort: "" }]]),
            ),
          }
        : {}),
      Mounts: spec.mounts.map((mount) => ({ Type: "bind", Source: mount.source, Target: mount.target })),
      RestartPolicy: { Name: "no" },
      AutoRemove: false,
      // Docker's own /dev/shm is noexec; an exec one of the asked size is a tmpfs over it.
      ...(spec.shmSize > 0
        ? { ShmSize: spec.shmSize, Tmpfs: { "/dev/shm": `exec,size=${spec.shmSize}` } }
        : {}),
      ...(spec.cpus > 0 ? { NanoCpus: Math.round(spec.cpus * 1e9) } : {}),
      ...(spec.memory > 0 ? { Memory: spec.memory } : {}),
      ...(spec.devices.length > 0
        ? {
            Devices: spec.devices.map((device) => ({
              PathOnHost: device.pathOnHost,
              PathInContainer: device.pathInContainer,
              CgroupPermissions: device.cgroupPermissions,
            })),
          }
        : {}),
      ...(spec.memlockUnlimited ? { Ulimits: [{ Name: "memlock", Soft: -1, Hard: -1 }] } : {}),
      ...(spec.gpuRequests.length > 0 ? { DeviceRequests: spec.gpuRequests.map(engineDeviceRequest) } : {}),
      ...(spec.capAdd.length > 0 ? { CapAdd: [...spec.capAdd] } : {}),
      ...(spec.securityOpt.length > 0 ? { SecurityOpt: [...spec.securityOpt] } : {}),
      ...(spec.ipcMode ? { IpcMode: spec.ipcMode } : {}),
      ...(spec.runtime ? { Runtime: spec.runtime } : {}),
    },
  };
}
