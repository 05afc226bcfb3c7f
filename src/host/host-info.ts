/*
 * Service mode's `host_info.json` content: what a dstack server reads of an SSH-fleet host after
 * it has deployed the shim (`cat <home>/host_info.json` every 3 s for 180 s), with dstack-shim's
 * eight fields and units (runner/internal/shim/host_info.go). state/host-info-file.ts writes it.
 */
import { statfs } from "node:fs/promises";
import { availableParallelism, networkInterfaces, totalmem } from "node:os";
import { isIPv4, isIPv6 } from "node:net";
import { errorMessage } from "../errors/error-message.js";
import { OperationBound } from "../exec/operation-bound.js";
import { runChecked, type CommandRunner } from "../exec/run-bounded.js";
import type { GpuInventory } from "./gpu-inventory.js";

/** `host_info.json`, field for field as dstack-shim writes it. */
export interface HostInfo {
  /** `none`, or the vendor of the host's GPUs. */
  readonly gpu_vendor: string;
  /** The first GPU's name; `""` without GPUs. */
  readonly gpu_name: string;
  /** The first GPU's memory in MiB; 0 without GPUs. */
  readonly gpu_memory: number;
  readonly gpu_count: number;
  /** Every non-loopback address of every interface, `ip/prefix`. */
  readonly addresses: readonly string[];
  /** Bytes available (`f_bavail * f_bsize`) on the engine's storage root. */
  readonly disk_size: number;
  /** CPUs this process may run on (Go's `runtime.NumCPU`, `nproc`). */
  readonly cpus: number;
  /** Total RAM in bytes (`MemTotal`). */
  readonly memory: number;
}

/** The host facts `host_info.json` is made of, behind a port so tests can stand in for them. */
export interface HostFacts {
  cpus(): number;
  memoryBytes(): number;
  /** Every non-loopback address, `ip/prefix`, in interface order. */
  addresses(): Promise<string[]>;
  /** Bytes available to unprivileged users on the file system holding `path`. */
  availableBytes(path: string): Promise<number>;
}

/** Where the engine keeps images and containers: Docker's `DockerRootDir`, Podman's graph root. */
export interface EngineStorageRoot {
  storageRoot(signal?: AbortSignal): Promise<string>;
}

/** What a host-info fact could not be read for; the fact is then 0 or empty, as dstack-shim has it. */
export type HostInfoProblem = { readonly fact: "addresses" | "disk_size"; readonly error: string };

const IP_DEADLINE_MS = 5_000;

/**
 * The addresses as `ip -j addr` lists them, loopback addresses left out (Go's
 * `IP.IsLoopback`): every interface, up or down, as dstack-shim's `net.Interfaces` sees them.
 * Node's `os.networkInterfaces()` skips interfaces without carrier (docker0 with no container
 * attached), so it is only the fallback where `ip` is missing or fails.
 */
export function parseIpAddrJson(text: string): string[] {
  const links: unknown = JSON.parse(text);
  if (!Array.isArray(links)) throw new Error("ip -j addr: not a JSON array");
  const out: string[] = [];
  for (const link of links as unknown[]) {
    const infos = (link as { addr_info?: unknown }).addr_info;
    if (!Array.isArray(infos)) continue;
    for (const info of infos as unknown[]) {
      const { local, prefixlen } = info as { local?: unknown; prefixlen?: unknown };
      if (typeof local !== "string" || typeof prefixlen !== "number") continue;
      if (!isIPv4(local) && !isIPv6(local)) continue;
      if (isLoopback(local)) continue;
      out.push(`${local}/${prefixlen}`);
    }
  }
  return out;
}

function isLoopback(address: string): boolean {
  return isIPv4(address) ? address.startsWith("127.") : address === "::1";
}

/** The real host's facts; `ip` runs under a deadline through `commands`. */
export function systemHostFacts(commands: CommandRunner): HostFacts {
  return {
    cpus: () => availableParallelism(),
    memoryBytes: () => totalmem(),
    addresses: async () => {
      try {
        const out = await runChecked(commands, {
          argv: ["ip", "-j", "addr", "show"],
          bound: OperationBound.within(IP_DEADLINE_MS),
        });
        return parseIpAddrJson(out);
      } catch {
        return Object.values(networkInterfaces())
          .flatMap((addresses) => addresses ?? [])
          .filter((a) => !isLoopback(a.address) && a.cidr !== null)
          .map((a) => a.cidr ?? "");
      }
    },
    availableBytes: async (path) => {
      const s = await statfs(path);
      return s.bavail * s.bsize;
    },
  };
}

/**
 * Collects `host_info.json`'s content. A fact that cannot be read is 0 or empty and reported in
 * `problems` (dstack-shim logs it and writes the file anyway: the host is still added).
 */
export async function collectHostInfo(
  inventory: GpuInventory,
  facts: HostFacts,
  engine: EngineStorageRoot,
  signal?: AbortSignal,
): Promise<{ readonly info: HostInfo; readonly problems: readonly HostInfoProblem[] }> {
  const problems: HostInfoProblem[] = [];
  const [addresses, diskSize] = await Promise.all([
    facts.addresses().catch((error: unknown) => {
      problems.push({ fact: "addresses", error: errorMessage(error) });
      return [];
    }),
    engine
      .storageRoot(signal)
      .then((root) => facts.availableBytes(root))
      .catch((error: unknown) => {
        problems.push({ fact: "disk_size", error: errorMessage(error) });
        return 0;
      }),
  ]);
  const first = inventory.gpus[0];
  return {
    info: {
      gpu_vendor: first === undefined ? "none" : inventory.vendor,
      gpu_name: first?.name ?? "",
      gpu_memory: first?.vramMiB ?? 0,
      gpu_count: inventory.gpus.length,
      addresses,
      disk_size: diskSize,
      cpus: facts.cpus(),
      memory: facts.memoryBytes(),
    },
    problems,
  };
}
