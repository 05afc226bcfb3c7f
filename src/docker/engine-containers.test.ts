import { describe, expect, it } from "vitest";
import { LABEL_CDI_DEVICES } from "./docker-client.js";
import { specForEngine } from "./engine-containers.js";
import { EngineGpuUnsupportedError } from "./gpu-devices.js";
import { plainContainerSpec } from "../testing/container-specs.js";

const NVIDIA = plainContainerSpec({
  labels: { a: "b" },
  gpuRequests: [{ deviceIds: ["GPU-a", "GPU-b"], capabilities: [["gpu"]] }],
});

describe("specForEngine", () => {
  it("gives Docker the spec as built", () => {
    expect(specForEngine(NVIDIA, { kind: "docker", version: "20.10.24" })).toBe(NVIDIA);
  });

  it("gives Podman 5.5 one CDI request and the label that records it, and changes nothing else", () => {
    const names = "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b";
    expect(specForEngine(NVIDIA, { kind: "podman", version: "5.5.2" })).toEqual({
      ...NVIDIA,
      labels: { a: "b", [LABEL_CDI_DEVICES]: names },
      gpuRequests: [{ driver: "cdi", deviceIds: names.split(","), capabilities: [] }],
    });
    expect(NVIDIA.labels).toEqual({ a: "b" });
  });

  it("refuses GPUs on Podman 4.3.1, and passes a spec without them", () => {
    const podman = { kind: "podman", version: "4.3.1" } as const;
    expect(() => specForEngine(NVIDIA, podman)).toThrow(EngineGpuUnsupportedError);
    const plain = plainContainerSpec();
    expect(specForEngine(plain, podman)).toBe(plain);
  });
});
