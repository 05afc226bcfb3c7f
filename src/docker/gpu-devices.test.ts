import { describe, expect, it } from "vitest";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { UnknownGpuIdError, gpuContainerConfig, gpuIdsFromContainer } from "./gpu-devices.js";
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
        DeviceIDs: ["GPU-b"],
        Capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
      },
    ]);
    expect(config.devices).toEqual([]);
    expect(config.ipcMode).toBeUndefined();
    const retry = gpuContainerConfig(NVIDIA, ["GPU-b"], { nvidiaDisplay: false });
    expect(retry.deviceRequests[0]?.Capabilities[0]).not.toContain("display");
  });

  it("passes AMD kfd and render nodes with host IPC, SYS_PTRACE and unconfined seccomp", () => {
    expect(gpuContainerConfig(AMD, ["/dev/dri/renderD136"])).toEqual({
      deviceRequests: [],
      devices: [
        { PathOnHost: "/dev/kfd", PathInContainer: "/dev/kfd", CgroupPermissions: "rwm" },
        {
          PathOnHost: "/dev/dri/renderD136",
          PathInContainer: "/dev/dri/renderD136",
          CgroupPermissions: "rwm",
        },
      ],
      capAdd: ["SYS_PTRACE"],
      securityOpt: ["seccomp=unconfined"],
      ipcMode: "host",
      env: [],
    });
  });

  it("substitutes fixture nodes on the host side only", () => {
    expect(gpuContainerConfig(AMD_FIXTURE, ["/dev/dri/renderD128"]).devices).toEqual([
      { PathOnHost: "/tmp/x/kfd", PathInContainer: "/dev/kfd", CgroupPermissions: "rwm" },
      { PathOnHost: "/tmp/x/renderD128", PathInContainer: "/dev/dri/renderD128", CgroupPermissions: "rwm" },
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
          DeviceIDs: ["GPU-b", "GPU-a"],
          Capabilities: [["gpu", "utility", "compute", "graphics", "video", "display", "compat32"]],
        },
      ],
      devices: [],
      capAdd: [],
      securityOpt: [],
      env: [],
    });
    // The request holds a copy: the caller's list is not shared with the container spec.
    expect(config.deviceRequests[0]?.DeviceIDs).not.toBe(ids);
    expect(
      gpuContainerConfig(NVIDIA, ["GPU-a"], { nvidiaDisplay: false }).deviceRequests[0]?.Capabilities,
    ).toEqual([["gpu", "utility", "compute", "graphics", "video", "compat32"]]);
    expect(
      gpuContainerConfig(NVIDIA, ["GPU-a"], { nvidiaDisplay: true }).deviceRequests[0]?.Capabilities[0],
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
    expect(gpuIdsFromContainer(AMD_FIXTURE, { Devices: [...config.devices] })).toEqual(ids);
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
