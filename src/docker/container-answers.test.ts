import { describe, expect, it } from "vitest";
import { deviceRequestsOf, extractPorts, listedPorts } from "./container-answers.js";

describe("extractPorts", () => {
  it("keeps IPv4 tcp bindings, sorted by container port", () => {
    expect(
      extractPorts({
        "10999/tcp": [
          { HostIp: "127.0.0.1", HostPort: "32768" },
          { HostIp: "::1", HostPort: "32768" },
        ],
        "10022/tcp": [{ HostIp: "127.0.0.1", HostPort: "32769" }],
        "53/udp": [{ HostIp: "127.0.0.1", HostPort: "32770" }],
        "80/tcp": null,
      }),
    ).toEqual([
      { host: 32769, container: 10022 },
      { host: 32768, container: 10999 },
    ]);
  });

  it("returns [] for no ports", () => {
    expect(extractPorts(null)).toEqual([]);
  });
});

describe("listedPorts", () => {
  it("reads a list's Ports as extractPorts reads the same bindings of an inspect", () => {
    expect(
      listedPorts([
        { IP: "127.0.0.1", PrivatePort: 10999, PublicPort: 32768, Type: "tcp" },
        { IP: "::1", PrivatePort: 10999, PublicPort: 32768, Type: "tcp" },
        { IP: "127.0.0.1", PrivatePort: 10022, PublicPort: 32769, Type: "tcp" },
        { IP: "127.0.0.1", PrivatePort: 53, PublicPort: 32770, Type: "udp" },
        { PrivatePort: 80, Type: "tcp" },
      ]),
    ).toEqual(
      extractPorts({
        "10999/tcp": [
          { HostIp: "127.0.0.1", HostPort: "32768" },
          { HostIp: "::1", HostPort: "32768" },
        ],
        "10022/tcp": [{ HostIp: "127.0.0.1", HostPort: "32769" }],
        "53/udp": [{ HostIp: "127.0.0.1", HostPort: "32770" }],
        "80/tcp": null,
      }),
    );
    expect(listedPorts(undefined)).toEqual([]);
  });
});

describe("deviceRequestsOf", () => {
  it("restores the CDI request from the label when the engine reports no device request", () => {
    expect(deviceRequestsOf(null, "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b")).toEqual([
      { Driver: "cdi", DeviceIDs: ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"] },
    ]);
    expect(deviceRequestsOf([], "nvidia.com/gpu=GPU-a")).toEqual([
      { Driver: "cdi", DeviceIDs: ["nvidia.com/gpu=GPU-a"] },
    ]);
  });

  it("keeps what the engine reports, and nothing without a label", () => {
    const reported = [{ DeviceIDs: ["GPU-a"] }];
    expect(deviceRequestsOf(reported, "nvidia.com/gpu=GPU-b")).toBe(reported);
    expect(deviceRequestsOf(null, undefined)).toBeNull();
    expect(deviceRequestsOf(undefined, "")).toBeNull();
    expect(deviceRequestsOf([], undefined)).toEqual([]);
  });
});
