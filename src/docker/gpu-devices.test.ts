import { describe, expect, it } from "vitest";
import type { GpuInventory } from "../host/gpu-inventory.js";
import {
  EngineGpuUnsupportedError,
  UnknownGpuIdError,
  gpuContainerConfig,
  gpuIdsFromContainer,
  gpuRequestsForEngine,
  nvidiaCdiName,
} from "./gpu-devices.js";
import type { GpuRequest } from "./docker-client.js";
import type { EngineInfo } from "./engine-info.js";
import { thrown } from "../testing/thrown.js";

const NVIDIA: GpuInventory = {
  vendor: "nvidia",
  gpus: [
    { vendor: "nvidia", name: "H100", vramMiB: 81559, id: "GPU-a", index: 0, driverVersion: "570" },
    { vendor: "nvidia", name: "H100", vramMiB: 81559, id: "GPU-b", index: 1, driverVersion: "570" },
  ],
};
const AMD: GpuInventory = {
  vendor: "amd",
  gpus: [
    { vendor: "amd", name: "MI300X", vramMiB: 1, id: "/dev/dri/renderD128", index: 0, driverVersion: "" },
    { vendor: "amd", name: "MI300X", vramMiB: 1, id: "/dev/dri/renderD136", index: 1, driverVersion: "" },
  ],
};
const AMD_FIXTURE: GpuInventory = {
  ...AMD,
  deviceOverrides: {
    "/dev/kfd": "/tmp/x/kfd",
    "/dev/dri/renderD128": "/tmp/x/renderD128",
    "/dev/dri/renderD136": "/tmp/x/renderD136",
  },
};

describe("gpuContainerConfig", () => {
  it("is empty without ids", () => {
    expect(gpuContainerConfig(NVIDIA, [])).toEqual({
      deviceRequests: [],
      devices: [],
      mounts: [],
      capAdd: [],
      securityOpt: [],
      env: [],
    });
    expect(gpuContainerConfig({ vendor: "none", gpus: [] }, [])).toMatchObject({ devices: [] });
  });

  it("requests NVIDIA GPUs by uuid with the capability list", () => {
    const config = gpuContainerConfig(NVIDIA, ["GPU-b"]);
    expect(config.deviceRequests).toEqual([
      {
        deviceIds: ["GPU-b"],
        capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
      },
    ]);
    expect(config.devices).toEqual([]);
    expect(config.ipcMode).toBeUndefined();
    const retry = gpuContainerConfig(NVIDIA, ["GPU-b"], { nvidiaDisplay: false });
    expect(retry.deviceRequests[0]?.capabilities[0]).not.toContain("display");
  });

  it("passes AMD kfd and render nodes with host IPC, SYS_PTRACE and unconfined seccomp", () => {
    expect(gpuContainerConfig(AMD, ["/dev/dri/renderD136"])).toEqual({
      deviceRequests: [],
      devices: [
        { pathOnHost: "/dev/kfd", pathInContainer: "/dev/kfd", cgroupPermissions: "rwm" },
        {
          pathOnHost: "/dev/dri/renderD136",
          pathInContainer: "/dev/dri/renderD136",
          cgroupPermissions: "rwm",
        },
      ],
      mounts: [],
      capAdd: ["SYS_PTRACE"],
      securityOpt: ["seccomp=unconfined"],
      ipcMode: "host",
      env: [],
    });
  });

  it("substitutes fixture nodes on the host side only", () => {
    expect(gpuContainerConfig(AMD_FIXTURE, ["/dev/dri/renderD128"]).devices).toEqual([
      { pathOnHost: "/tmp/x/kfd", pathInContainer: "/dev/kfd", cgroupPermissions: "rwm" },
      { pathOnHost: "/tmp/x/renderD128", pathInContainer: "/dev/dri/renderD128", cgroupPermissions: "rwm" },
    ]);
  });

  it("rejects ids the inventory does not have", () => {
    expect(() => gpuContainerConfig(NVIDIA, ["GPU-z"])).toThrow(UnknownGpuIdError);
    expect(() => gpuContainerConfig({ vendor: "none", gpus: [] }, ["x"])).toThrow(UnknownGpuIdError);
  });

  it("names only the unknown ids, or every id when the host has no GPU vendor", () => {
    const partly = thrown(() => gpuContainerConfig(NVIDIA, ["GPU-a", "GPU-y", "GPU-z"]));
    expect([partly.name, partly.message]).toEqual(["UnknownGpuIdError", "unknown GPU id(s): GPU-y, GPU-z"]);
    // A "none" inventory with GPUs listed is invalid anyway; every id is then unknown.
    const none = thrown(() => gpuContainerConfig({ ...NVIDIA, vendor: "none" }, ["GPU-a", "GPU-b"]));
    expect(none.message).toBe("unknown GPU id(s): GPU-a, GPU-b");
  });

  it("requests exactly the NVIDIA ids given, in order, with no driver and nothing else", () => {
    const ids = ["GPU-b", "GPU-a"];
    const config = gpuContainerConfig(NVIDIA, ids);
    expect(config).toEqual({
      deviceRequests: [
        {
          deviceIds: ["GPU-b", "GPU-a"],
          capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
        },
      ],
      devices: [],
      mounts: [],
      capAdd: [],
      securityOpt: [],
      env: [],
    });
    // The request holds a copy: the caller's list is not shared with the container spec.
    expect(config.deviceRequests[0]?.deviceIds).not.toBe(ids);
    expect(
      gpuContainerConfig(NVIDIA, ["GPU-a"], { nvidiaDisplay: false }).deviceRequests[0]?.capabilities,
    ).toEqual([["gpu", "utility", "compute", "graphics", "video", "compat32"]]);
    expect(
      gpuContainerConfig(NVIDIA, ["GPU-a"], { nvidiaDisplay: true }).deviceRequests[0]?.capabilities[0],
    ).toContain("display");
  });
});

describe("gpuIdsFromContainer", () => {
  it("reads the ids of a single NVIDIA device request", () => {
    expect(gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{ DeviceIDs: ["GPU-a", "GPU-b"] }] })).toEqual([
      "GPU-a",
      "GPU-b",
    ]);
    expect(
      gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{ DeviceIDs: ["GPU-a"] }, { DeviceIDs: ["GPU-b"] }] }),
    ).toEqual([]);
    expect(
      gpuIdsFromContainer(NVIDIA, { DeviceRequests: null, Devices: [{ PathOnHost: "/dev/nvidia0" }] }),
    ).toEqual([]);
  });

  it("reads AMD render nodes from the devices", () => {
    const hostConfig = {
      Devices: [
        { PathOnHost: "/dev/kfd", PathInContainer: "/dev/kfd" },
        { PathOnHost: "/dev/dri/renderD136", PathInContainer: "/dev/dri/renderD136" },
        { PathOnHost: "/dev/infiniband", PathInContainer: "/dev/infiniband" },
      ],
    };
    expect(gpuIdsFromContainer(AMD, hostConfig)).toEqual(["/dev/dri/renderD136"]);
  });

  it("skips render nodes the inventory does not have", () => {
    const hostConfig = {
      Devices: [{ PathOnHost: "/dev/dri/renderD129" }, { PathOnHost: "/dev/dri/renderD128" }],
    };
    expect(gpuIdsFromContainer(AMD, hostConfig)).toEqual(["/dev/dri/renderD128"]);
  });

  it("maps fixture nodes back to GPU ids, round-tripping gpuContainerConfig", () => {
    const ids = ["/dev/dri/renderD128", "/dev/dri/renderD136"];
    const config = gpuContainerConfig(AMD_FIXTURE, ids);
    const Devices = config.devices.map((d) => ({
      PathOnHost: d.pathOnHost,
      PathInContainer: d.pathInContainer,
    }));
    expect(gpuIdsFromContainer(AMD_FIXTURE, { Devices })).toEqual(ids);
  });

  it("drops empty and missing NVIDIA ids, and reads no ids from an empty request", () => {
    expect(gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{ DeviceIDs: ["", "GPU-b"] }] })).toEqual([
      "GPU-b",
    ]);
    expect(
      gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{ DeviceIDs: [7 as unknown as string, "GPU-a"] }] }),
    ).toEqual(["GPU-a"]);
    expect(gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{}] })).toEqual([]);
    expect(gpuIdsFromContainer(NVIDIA, { DeviceRequests: [] })).toEqual([]);
    expect(gpuIdsFromContainer(NVIDIA, {})).toEqual([]);
  });

  it("reads each AMD node once, skips devices without a host path, and normalises the path", () => {
    const hostConfig = {
      Devices: [
        { PathInContainer: "/dev/dri/renderD136" },
        { PathOnHost: "/dev/dri//renderD136" },
        { PathOnHost: "/dev/dri/renderD136" },
        { PathOnHost: "/dev/dri/../dri/renderD128" },
      ],
    };
    expect(gpuIdsFromContainer(AMD, hostConfig)).toEqual(["/dev/dri/renderD136", "/dev/dri/renderD128"]);
    expect(gpuIdsFromContainer(AMD, { Devices: null })).toEqual([]);
    expect(gpuIdsFromContainer(AMD, {})).toEqual([]);
  });

  it("does not read NVIDIA device requests on an AMD host, nor AMD devices on an NVIDIA host", () => {
    const both = {
      DeviceRequests: [{ DeviceIDs: ["GPU-a"] }],
      Devices: [{ PathOnHost: "/dev/dri/renderD128" }],
    };
    expect(gpuIdsFromContainer(AMD, both)).toEqual(["/dev/dri/renderD128"]);
    expect(gpuIdsFromContainer(NVIDIA, both)).toEqual(["GPU-a"]);
  });

  it("finds nothing without a host config or GPUs", () => {
    expect(gpuIdsFromContainer(NVIDIA, undefined)).toEqual([]);
    expect(
      gpuIdsFromContainer({ vendor: "none", gpus: [] }, { Devices: [{ PathOnHost: "/dev/dri/renderD128" }] }),
    ).toEqual([]);
  });
});

const DOCKER: EngineInfo = { kind: "docker", version: "20.10.24+dfsg1" };
const PODMAN_5_5: EngineInfo = { kind: "podman", version: "5.5.0" };
const PODMAN_4_3: EngineInfo = { kind: "podman", version: "4.3.1" };

/** The GPU requests container-spec.ts takes from a GPU config. */
function requestsOf(inventory: GpuInventory, ids: string[]): readonly GpuRequest[] {
  return gpuContainerConfig(inventory, ids).deviceRequests;
}

describe("gpuRequestsForEngine", () => {
  it("leaves Docker's NVIDIA device request as built", () => {
    const gpuRequests = requestsOf(NVIDIA, ["GPU-a", "GPU-b"]);
    expect(gpuRequestsForEngine(gpuRequests, DOCKER)).toEqual({ gpuRequests, cdiDevices: [] });
  });

  it("turns NVIDIA's request into one CDI request by UUID on Podman 5.5 and later", () => {
    const gpuRequests = requestsOf(NVIDIA, ["GPU-b", "GPU-a"]);
    const translated = gpuRequestsForEngine(gpuRequests, PODMAN_5_5);
    expect(translated).toEqual({
      gpuRequests: [
        { driver: "cdi", deviceIds: ["nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"], capabilities: [] },
      ],
      cdiDevices: ["nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a"],
    });
    // A copy: the spec the runner keeps is not changed.
    expect(gpuRequests).toEqual([
      {
        deviceIds: ["GPU-b", "GPU-a"],
        capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
      },
    ]);
    expect(
      gpuRequestsForEngine(gpuRequests, { kind: "podman", version: "6.0.0-dev" }).cdiDevices,
    ).toHaveLength(2);
  });

  it("keeps names of a request already for CDI, and joins several requests into one", () => {
    const gpuRequests: GpuRequest[] = [
      { driver: "cdi", deviceIds: ["nvidia.com/gpu=all"], capabilities: [] },
      { deviceIds: ["GPU-a", ""], capabilities: [["gpu"]] },
    ];
    expect(gpuRequestsForEngine(gpuRequests, PODMAN_5_5).gpuRequests).toEqual([
      { driver: "cdi", deviceIds: ["nvidia.com/gpu=all", "nvidia.com/gpu=GPU-a"], capabilities: [] },
    ]);
  });

  it("refuses GPUs on a Podman before 5.5, whose compatible API would start the container without them", () => {
    const error = thrown(() => gpuRequestsForEngine(requestsOf(NVIDIA, ["GPU-a"]), PODMAN_4_3));
    expect(error).toBeInstanceOf(EngineGpuUnsupportedError);
    expect(error.message).toBe(
      "Podman 4.3.1 cannot give a container GPUs through its Docker-compatible API (it drops device requests; CDI device requests are passed from Podman 5.5.0)",
    );
    expect(() =>
      gpuRequestsForEngine(requestsOf(NVIDIA, ["GPU-a"]), { kind: "podman", version: "unknown" }),
    ).toThrow(EngineGpuUnsupportedError);
  });

  it("refuses a request without device ids on Podman: CDI takes devices by name", () => {
    const unnamed: GpuRequest[] = [{ deviceIds: [""], capabilities: [["gpu"]] }];
    expect(() => gpuRequestsForEngine(unnamed, PODMAN_5_5)).toThrow(EngineGpuUnsupportedError);
    expect(gpuRequestsForEngine(unnamed, DOCKER).gpuRequests).toBe(unnamed);
  });

  it("leaves AMD's device nodes (no requests) and a spec without GPUs as they are, on either engine", () => {
    expect(requestsOf(AMD, ["/dev/dri/renderD128"])).toEqual([]);
    for (const engine of [DOCKER, PODMAN_4_3, PODMAN_5_5]) {
      const none: GpuRequest[] = [];
      expect(gpuRequestsForEngine(none, engine)).toEqual({ gpuRequests: none, cdiDevices: [] });
      expect(gpuRequestsForEngine(none, engine).gpuRequests).toBe(none);
    }
  });

  it("round-trips through gpuIdsFromContainer: CDI names read back as the inventory's UUIDs", () => {
    const { cdiDevices } = gpuRequestsForEngine(requestsOf(NVIDIA, ["GPU-a", "GPU-b"]), PODMAN_5_5);
    expect(cdiDevices).toEqual([nvidiaCdiName("GPU-a"), nvidiaCdiName("GPU-b")]);
    expect(
      gpuIdsFromContainer(NVIDIA, { DeviceRequests: [{ Driver: "cdi", DeviceIDs: [...cdiDevices] }] }),
    ).toEqual(["GPU-a", "GPU-b"]);
  });

  it("reads only NVIDIA's CDI kind as GPU ids, and drops an empty name", () => {
    expect(
      gpuIdsFromContainer(NVIDIA, {
        DeviceRequests: [
          { Driver: "cdi", DeviceIDs: ["nvidia.com/gpu=", "nvidia.com/gpu=GPU-b", "vendor.com/x=1"] },
        ],
      }),
    ).toEqual(["GPU-b", "vendor.com/x=1"]);
  });
});
