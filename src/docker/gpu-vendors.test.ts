import { describe, expect, it } from "vitest";
import type { ContainerDetails } from "./docker-client.js";
import type { GpuInfo, GpuInventory } from "../host/gpu-inventory.js";
import { buildContainerSpec, type ContainerParams, type ContainerTaskConfig } from "./container-spec.js";
import { engineCreateBody } from "./engine-create-body.js";
import { specForEngine } from "./engine-containers.js";
import {
  gpuContainerConfig,
  gpuIdsFromContainer,
  UnknownGpuIdError,
  type GpuContainerConfigOptions,
} from "./gpu-devices.js";

/*
 * The container every vendor's GPUs get, asserted field for field in the create body the engine
 * receives (HostConfig Devices, Mounts, Runtime, IpcMode, CapAdd, SecurityOpt, DeviceRequests, and
 * Env), and read back from the inspected container after a restart.
 */

const gpus = (vendor: GpuInfo["vendor"], ids: readonly string[]): GpuInfo[] =>
  ids.map((id, index) => ({ vendor, name: "x", vramMiB: 1, id, index, driverVersion: "" }));

const NVIDIA: GpuInventory = { vendor: "nvidia", gpus: gpus("nvidia", ["GPU-a", "GPU-b"]) };
const AMD: GpuInventory = {
  vendor: "amd",
  gpus: gpus("amd", ["/dev/dri/renderD128", "/dev/dri/renderD129"]),
};
const TENSTORRENT: GpuInventory = { vendor: "tenstorrent", gpus: gpus("tenstorrent", ["0", "1", "2", "3"]) };
const INTEL: GpuInventory = {
  vendor: "intel",
  gpus: gpus("intel", ["0", "1", "2", "3", "4", "5", "6", "7"]),
};
const TENSTORRENT_FIXTURE: GpuInventory = {
  ...TENSTORRENT,
  deviceOverrides: {
    "/dev/tenstorrent/0": "/tmp/f/tt0",
    "/dev/tenstorrent/1": "/tmp/f/tt1",
    "/dev/tenstorrent/2": "/tmp/f/tt2",
    "/dev/tenstorrent/3": "/tmp/f/tt3",
    "/dev/hugepages-1G": "/tmp/f/hugepages-1G",
  },
};

const params: ContainerParams = {
  runnerBinaryPath: "/usr/local/bin/dstack-runner",
  runnerHttpPort: 10999,
  runnerSshPort: 10022,
  runnerLogLevel: "info",
  runnerSshLogLevel: "",
  baseEnv: ["HTTP_PROXY=http://proxy:3128"],
  privileged: false,
  pjrtDevice: "",
  volumeMountRoot: "/mnt/disks/dstack-volumes",
  infiniband: false,
};

const config: ContainerTaskConfig = {
  id: "t-1",
  image_name: "ubuntu:22.04",
  container_user: "root",
  privileged: false,
  cpu: 0,
  memory: 0,
  shm_size: 0,
  network_mode: "host",
  volume_mounts: [],
  instance_mounts: [],
  gpu_devices: [],
  container_ssh_keys: [],
  command: ["true"],
};

/** The GPU-related part of the create body, every field present (absent ones as undefined). */
function gpuFields(
  inventory: GpuInventory,
  ids: readonly string[],
  options: GpuContainerConfigOptions = {},
  task: Partial<ContainerTaskConfig> = {},
) {
  const body = engineCreateBody(
    buildContainerSpec({
      config: { ...config, ...task },
      containerName: "job-1",
      runnerDir: "/home/runners/job-1/runner",
      params,
      gpu: gpuContainerConfig(inventory, ids, options),
      owner: "home-1",
    }),
  );
  const host = body.HostConfig as Record<string, unknown>;
  return {
    Devices: host.Devices,
    DeviceRequests: host.DeviceRequests,
    // The runner's own dir is always the first mount; only what follows it is the GPUs'.
    Mounts: (host.Mounts as unknown[]).slice(1),
    Runtime: host.Runtime,
    IpcMode: host.IpcMode,
    CapAdd: host.CapAdd,
    SecurityOpt: host.SecurityOpt,
    Env: body.Env,
  };
}

const rwm = (path: string, onHost = path) => ({
  PathOnHost: onHost,
  PathInContainer: path,
  CgroupPermissions: "rwm",
});
const noHugepages = { hostPathExists: () => false };
const withHugepages = (seen: string[] = []) => ({
  hostPathExists: (path: string) => {
    seen.push(path);
    return true;
  },
});

describe("the container spec per vendor, as dstack-shim's configureGpus sets it", () => {
  it("NVIDIA: one device request with the uuids and every capability; no devices, runtime or env", () => {
    expect(gpuFields(NVIDIA, ["GPU-b"])).toEqual({
      Devices: undefined,
      DeviceRequests: [
        {
          DeviceIDs: ["GPU-b"],
          Capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
        },
      ],
      Mounts: [],
      Runtime: undefined,
      IpcMode: undefined,
      CapAdd: undefined,
      SecurityOpt: undefined,
      Env: ["HTTP_PROXY=http://proxy:3128"],
    });
    expect(gpuFields(NVIDIA, ["GPU-b"], { nvidiaDisplay: false }).DeviceRequests).toEqual([
      {
        DeviceIDs: ["GPU-b"],
        Capabilities: [["gpu", "utility", "compute", "graphics", "video", "compat32"]],
      },
    ]);
  });

  it("AMD: /dev/kfd and the render nodes, host IPC, SYS_PTRACE, unconfined seccomp (as before)", () => {
    expect(gpuFields(AMD, ["/dev/dri/renderD129"])).toEqual({
      Devices: [rwm("/dev/kfd"), rwm("/dev/dri/renderD129")],
      DeviceRequests: undefined,
      Mounts: [],
      Runtime: undefined,
      IpcMode: "host",
      CapAdd: ["SYS_PTRACE"],
      SecurityOpt: ["seccomp=unconfined"],
      Env: ["HTTP_PROXY=http://proxy:3128"],
    });
  });

  it("Tenstorrent: each /dev/tenstorrent/<id> as a device, /dev/hugepages-1G bound when the host has it", () => {
    const seen: string[] = [];
    expect(gpuFields(TENSTORRENT, ["1", "3"], withHugepages(seen))).toEqual({
      Devices: [rwm("/dev/tenstorrent/1"), rwm("/dev/tenstorrent/3")],
      DeviceRequests: undefined,
      Mounts: [{ Type: "bind", Source: "/dev/hugepages-1G", Target: "/dev/hugepages-1G" }],
      Runtime: undefined,
      IpcMode: undefined,
      CapAdd: undefined,
      SecurityOpt: undefined,
      Env: ["HTTP_PROXY=http://proxy:3128"],
    });
    expect(seen).toEqual(["/dev/hugepages-1G"]);
    expect(gpuFields(TENSTORRENT, ["0"], noHugepages).Mounts).toEqual([]);
  });

  it("Tenstorrent with a fixture: the host's stand-in nodes and huge page dir, at the standard paths", () => {
    const seen: string[] = [];
    const fields = gpuFields(TENSTORRENT_FIXTURE, ["0", "2"], withHugepages(seen));
    expect(fields.Devices).toEqual([
      rwm("/dev/tenstorrent/0", "/tmp/f/tt0"),
      rwm("/dev/tenstorrent/2", "/tmp/f/tt2"),
    ]);
    expect(fields.Mounts).toEqual([
      { Type: "bind", Source: "/tmp/f/hugepages-1G", Target: "/dev/hugepages-1G" },
    ]);
    // Whether the stand-in exists is what is asked, not the real path.
    expect(seen).toEqual(["/tmp/f/hugepages-1G"]);
  });

  it("Intel Gaudi: the habana runtime, host IPC, SYS_NICE and HABANA_VISIBLE_DEVICES (before the task's env)", () => {
    expect(gpuFields(INTEL, ["2", "3", "6"], {}, { env: { HABANA_LOGS: "/tmp/logs" } })).toEqual({
      Devices: undefined,
      DeviceRequests: undefined,
      Mounts: [],
      Runtime: "habana",
      IpcMode: "host",
      CapAdd: ["SYS_NICE"],
      SecurityOpt: undefined,
      Env: ["HTTP_PROXY=http://proxy:3128", "HABANA_VISIBLE_DEVICES=2,3,6", "HABANA_LOGS=/tmp/logs"],
    });
  });

  it("explicit gpu_devices replace the vendor setup for every vendor: no runtime, env, mounts or IPC", () => {
    const explicit = {
      gpu_devices: [{ path_on_host: "/dev/accel/accel0", path_in_container: "/dev/accel/accel0" }],
    };
    for (const [inventory, ids] of [
      [INTEL, ["0"]],
      [TENSTORRENT, ["0"]],
    ] as const) {
      expect(gpuFields(inventory, ids, withHugepages(), explicit), inventory.vendor).toEqual({
        Devices: [rwm("/dev/accel/accel0")],
        DeviceRequests: undefined,
        Mounts: [],
        Runtime: undefined,
        IpcMode: undefined,
        CapAdd: undefined,
        SecurityOpt: undefined,
        Env: ["HTTP_PROXY=http://proxy:3128"],
      });
    }
  });

  it("refuses ids the inventory does not have, for every vendor", () => {
    expect(() => gpuContainerConfig(TENSTORRENT, ["4"])).toThrow(UnknownGpuIdError);
    expect(() => gpuContainerConfig(INTEL, ["8"])).toThrow(UnknownGpuIdError);
    expect(() => gpuContainerConfig(INTEL, ["/dev/accel/accel0"])).toThrow(UnknownGpuIdError);
  });

  it("is the same on Podman: Tenstorrent's devices and Gaudi's runtime are not device requests", () => {
    for (const [inventory, ids] of [
      [TENSTORRENT, ["0"]],
      [INTEL, ["0"]],
    ] as const) {
      const spec = buildContainerSpec({
        config,
        containerName: "job-1",
        runnerDir: "/home/runners/job-1/runner",
        params,
        gpu: gpuContainerConfig(inventory, ids, noHugepages),
        owner: "home-1",
      });
      expect(specForEngine(spec, { kind: "podman", version: "4.3.1" })).toBe(spec);
    }
  });
});

/** What an inspect of the container `gpuFields` describes reports back. */
function inspected(
  inventory: GpuInventory,
  ids: readonly string[],
): { hostConfig: ContainerDetails["hostConfig"]; env: string[] } {
  const gpu = gpuContainerConfig(inventory, ids, withHugepages());
  return {
    hostConfig: {
      Devices: gpu.devices.map((d) => ({ PathOnHost: d.pathOnHost, PathInContainer: d.pathInContainer })),
      DeviceRequests: gpu.deviceRequests.map((r) => ({ DeviceIDs: [...r.deviceIds] })),
    },
    env: ["PATH=/usr/bin", ...gpu.env],
  };
}

describe("gpuIdsFromContainer per vendor, as dstack-shim's restoreStateFromContainers reads them", () => {
  it.each([
    ["nvidia", NVIDIA, ["GPU-b", "GPU-a"]],
    ["amd", AMD, ["/dev/dri/renderD129"]],
    ["tenstorrent", TENSTORRENT, ["3", "0"]],
    ["tenstorrent (fixture nodes)", TENSTORRENT_FIXTURE, ["2", "1"]],
    ["intel", INTEL, ["6", "7", "0"]],
  ] as const)("round-trips %s", (_vendor, inventory, ids) => {
    const { hostConfig, env } = inspected(inventory, ids);
    expect(gpuIdsFromContainer(inventory, hostConfig, env)).toEqual(ids);
  });

  it("Tenstorrent: reads only /dev/tenstorrent/<id> devices the inventory has, each once", () => {
    const hostConfig = {
      Devices: [
        { PathOnHost: "/dev/infiniband", PathInContainer: "/dev/infiniband" },
        { PathOnHost: "/dev/tenstorrent/2" },
        { PathOnHost: "/dev//tenstorrent/2" },
        { PathOnHost: "/dev/tenstorrent/9" },
        { PathOnHost: "/dev/tenstorrentx/1" },
        {},
        { PathOnHost: "/dev/tenstorrent/0" },
      ],
    };
    expect(gpuIdsFromContainer(TENSTORRENT, hostConfig)).toEqual(["2", "0"]);
    expect(gpuIdsFromContainer(TENSTORRENT, { Devices: null })).toEqual([]);
  });

  it("Intel: reads the first HABANA_VISIBLE_DEVICES, known indices only, each once; none without it", () => {
    const read = (env: string[]) => gpuIdsFromContainer(INTEL, {}, env);
    expect(read(["HABANA_VISIBLE_DEVICES=1,3,3,12,", "HABANA_VISIBLE_DEVICES=5"])).toEqual(["1", "3"]);
    expect(read(["XHABANA_VISIBLE_DEVICES=1", "HABANA_VISIBLE_DEVICES_X=2"])).toEqual([]);
    expect(read([])).toEqual([]);
    expect(gpuIdsFromContainer(INTEL, {})).toEqual([]);
    expect(gpuIdsFromContainer(INTEL, undefined, ["HABANA_VISIBLE_DEVICES=1"])).toEqual([]);
  });

  it("reads each vendor's own place only: the same container means nothing to another vendor", () => {
    const tt = inspected(TENSTORRENT, ["0", "1"]);
    const gaudi = inspected(INTEL, ["0", "1"]);
    expect(gpuIdsFromContainer(INTEL, tt.hostConfig, tt.env)).toEqual([]);
    expect(gpuIdsFromContainer(TENSTORRENT, gaudi.hostConfig, gaudi.env)).toEqual([]);
    expect(gpuIdsFromContainer({ vendor: "none", gpus: [] }, tt.hostConfig, gaudi.env)).toEqual([]);
  });
});
