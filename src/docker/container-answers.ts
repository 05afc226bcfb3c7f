/*
 * The engine's answers about containers (a list, an inspect) read as the port's types. Pure, so
 * each engine's shape of an answer is tested without an engine.
 */
import type Docker from "dockerode";
import {
  LABEL_CDI_DEVICES,
  LABEL_OWNER,
  LABEL_TASK_ID,
  type ContainerDetails,
  type TaskContainerSummary,
} from "./docker-client.js";
import { containerStateOf } from "./podman-compat.js";
import type { PortMapping } from "../tasks/task-parts.js";

/** One container of a list answer. */
export function containerSummaryOf(container: Docker.ContainerInfo): TaskContainerSummary {
  return {
    id: container.Id,
    name: (container.Names[0] ?? "").replace(/^\//, ""),
    taskId: container.Labels[LABEL_TASK_ID] ?? "",
    owner: container.Labels[LABEL_OWNER] ?? "",
    state: containerStateOf(container.State),
    ports: listedPorts(container.Ports),
  };
}

/** An inspect answer. */
export function containerDetailsOf(info: Docker.ContainerInspectInfo): ContainerDetails {
  return {
    id: info.Id,
    name: info.Name.replace(/^\//, ""),
    taskId: info.Config.Labels?.[LABEL_TASK_ID] ?? "",
    owner: info.Config.Labels?.[LABEL_OWNER] ?? "",
    state: containerStateOf(info.State.Status),
    exitCode: info.State.ExitCode,
    oomKilled: info.State.OOMKilled,
    error: info.State.Error,
    startedAt: info.State.StartedAt,
    finishedAt: info.State.FinishedAt,
    restartCount: info.RestartCount,
    ports: extractPorts(info.NetworkSettings.Ports),
    mounts: (info.Mounts ?? []).map((m) => ({ source: m.Source, destination: m.Destination })),
    hostConfig: {
      DeviceRequests: deviceRequestsOf(
        info.HostConfig.DeviceRequests,
        info.Config.Labels?.[LABEL_CDI_DEVICES],
      ),
      Devices: (info.HostConfig.Devices ?? null) as
        { PathOnHost?: string; PathInContainer?: string }[] | null,
    },
    env: info.Config.Env ?? [],
  };
}

/**
 * An inspect's device requests; on Podman, which reports none, the CDI request the shim made,
 * read back from its label ({@link LABEL_CDI_DEVICES}).
 */
export function deviceRequestsOf(
  reported: readonly unknown[] | null | undefined,
  cdiLabel: string | undefined,
): { Driver?: string; DeviceIDs?: string[] }[] | null {
  const names = (cdiLabel ?? "").split(",").filter((name) => name !== "");
  if ((reported ?? []).length === 0 && names.length > 0) return [{ Driver: "cdi", DeviceIDs: names }];
  return (reported ?? null) as { Driver?: string; DeviceIDs?: string[] }[] | null;
}

/**
 * Host port bindings (tcp, IPv4) from a list's `Ports`: the same bindings as an inspect's
 * NetworkSettings.Ports (one entry per binding, `PublicPort` absent when not published).
 */
export function listedPorts(
  ports:
    readonly { IP?: string; PrivatePort: number; PublicPort?: number; Type: string }[] | undefined | null,
): PortMapping[] {
  const mappings: PortMapping[] = [];
  for (const port of ports ?? []) {
    if (port.Type !== "tcp" || port.IP?.includes(":")) continue;
    const host = Number(port.PublicPort);
    if (Number.isInteger(host) && host > 0 && Number.isInteger(port.PrivatePort))
      mappings.push({ host, container: port.PrivatePort });
  }
  return mappings.sort((x, y) => x.container - y.container);
}

/** Host port bindings (tcp, IPv4) from an inspect's NetworkSettings.Ports. */
export function extractPorts(
  ports: Record<string, { HostIp?: string; HostPort?: string }[] | null> | undefined | null,
): PortMapping[] {
  const mappings: PortMapping[] = [];
  for (const [key, bindings] of Object.entries(ports ?? {})) {
    const [port, proto] = key.split("/");
    if (proto !== "tcp" || !bindings) continue;
    for (const binding of bindings) {
      if (binding.HostIp?.includes(":")) continue;
      const host = Number(binding.HostPort);
      const container = Number(port);
      if (Number.isInteger(host) && host > 0 && Number.isInteger(container))
        mappings.push({ host, container });
    }
  }
  return mappings.sort((a, b) => a.container - b.container);
}
