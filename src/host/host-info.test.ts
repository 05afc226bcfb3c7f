import { describe, expect, it } from "vitest";
import type { CommandRunner } from "../exec/run-bounded.js";
import type { GpuInventory } from "./gpu-inventory.js";
import { collectHostInfo, parseIpAddrJson, systemHostFacts, type HostFacts } from "./host-info.js";

/*
 * `ip -j addr show` as recorded on a test machine: loopback, two interfaces without addresses,
 * eth0 (IPv4, a global and a link-local IPv6) and docker0 without carrier (no container attached),
 * which Node's os.networkInterfaces() leaves out and dstack-shim lists.
 */
const IP_J_ADDR = JSON.stringify([
  {
    ifindex: 1,
    ifname: "lo",
    flags: ["LOOPBACK", "UP", "LOWER_UP"],
    addr_info: [
      { family: "inet", local: "127.0.0.1", prefixlen: 8, scope: "host", label: "lo" },
      { family: "inet6", local: "::1", prefixlen: 128, scope: "host" },
    ],
  },
  { ifindex: 2, ifname: "ifb0", flags: ["BROADCAST", "NOARP"], addr_info: [] },
  { ifindex: 3, ifname: "ifb1", flags: ["BROADCAST", "NOARP"], addr_info: [] },
  {
    ifindex: 4,
    ifname: "eth0",
    flags: ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
    addr_info: [
      { family: "inet", local: "192.0.2.2", prefixlen: 24, broadcast: "192.0.2.255", scope: "global" },
      { family: "inet6", local: "fd00::2", prefixlen: 64, scope: "global" },
      { family: "inet6", local: "fe80::fc:ff:fe00:1", prefixlen: 64, scope: "link" },
    ],
  },
  {
    ifindex: 5,
    ifname: "docker0",
    flags: ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
    addr_info: [{ family: "inet", local: "172.17.0.1", prefixlen: 16, scope: "global" }],
  },
]);

const NO_GPUS: GpuInventory = { vendor: "none", gpus: [] };
const facts = (overrides: Partial<HostFacts> = {}): HostFacts => ({
  cpus: () => 96,
  memoryBytes: () => 1_081_000_000_000,
  addresses: () => Promise.resolve(["10.0.0.5/24"]),
  availableBytes: (path) => Promise.resolve(path === "/var/lib/docker" ? 512_000_000_000 : -1),
  ...overrides,
});
const dockerRoot = { storageRoot: () => Promise.resolve("/var/lib/docker") };

describe("parseIpAddrJson", () => {
  it("lists every non-loopback address in interface order, docker0 without carrier included", () => {
    expect(parseIpAddrJson(IP_J_ADDR)).toEqual([
      "192.0.2.2/24",
      "fd00::2/64",
      "fe80::fc:ff:fe00:1/64",
      "172.17.0.1/16",
    ]);
  });

  it("leaves out every 127/8 address and ::1, not only the lo interface's", () => {
    const links = [
      {
        addr_info: [
          { local: "127.0.1.1", prefixlen: 8 },
          { local: "10.1.2.3", prefixlen: 8 },
        ],
      },
    ];
    expect(parseIpAddrJson(JSON.stringify(links))).toEqual(["10.1.2.3/8"]);
  });

  it("refuses an answer that is not a list of links", () => {
    expect(() => parseIpAddrJson("{}")).toThrow(/not a JSON array/);
  });
});

describe("collectHostInfo", () => {
  it("writes dstack-shim's eight fields from the host facts, `none` without GPUs", async () => {
    const { info, problems } = await collectHostInfo(NO_GPUS, facts(), dockerRoot);
    expect(problems).toEqual([]);
    expect(info).toEqual({
      gpu_vendor: "none",
      gpu_name: "",
      gpu_memory: 0,
      gpu_count: 0,
      addresses: ["10.0.0.5/24"],
      disk_size: 512_000_000_000,
      cpus: 96,
      memory: 1_081_000_000_000,
    });
  });

  it("takes the GPU fields from the first GPU, in MiB, and counts them all", async () => {
    const gpu = (index: number) => ({
      vendor: "nvidia" as const,
      name: "NVIDIA H100 80GB HBM3",
      vramMiB: 81_559 + index,
      id: `GPU-${index}`,
      index,
      driverVersion: "550.54.15",
    });
    const inventory: GpuInventory = { vendor: "nvidia", gpus: [gpu(0), gpu(1), gpu(2)] };
    const { info } = await collectHostInfo(inventory, facts(), dockerRoot);
    expect(info).toMatchObject({
      gpu_vendor: "nvidia",
      gpu_name: "NVIDIA H100 80GB HBM3",
      gpu_memory: 81_559,
      gpu_count: 3,
    });
  });

  it("writes 0 and [] for a fact it cannot read, and says which (the host is still added)", async () => {
    const { info, problems } = await collectHostInfo(
      NO_GPUS,
      facts({ addresses: () => Promise.reject(new Error("no netlink")) }),
      { storageRoot: () => Promise.reject(new Error("engine /info timed out")) },
    );
    expect(info.disk_size).toBe(0);
    expect(info.addresses).toEqual([]);
    expect(problems).toEqual([
      { fact: "addresses", error: "no netlink" },
      { fact: "disk_size", error: "engine /info timed out" },
    ]);
  });
});

describe("systemHostFacts", () => {
  it("falls back to Node's interfaces when `ip` cannot run, loopback still left out", async () => {
    const missingIp: CommandRunner = { run: () => Promise.reject(new Error("spawn ip ENOENT")) };
    const addresses = await systemHostFacts(missingIp).addresses();
    expect(addresses.every((a) => /^[0-9a-f.:]+\/\d+$/.test(a))).toBe(true);
    expect(addresses.some((a) => a.startsWith("127.") || a === "::1/128")).toBe(false);
  });

  it("measures the bytes available where the engine keeps its data", async () => {
    expect(
      await systemHostFacts({ run: () => Promise.reject(new Error("unused")) }).availableBytes("/"),
    ).toBeGreaterThan(0);
  });
});
