/* Ready-made inputs for unit tests: GPUs, SSH keys, submit bodies and task configs. */
import { generateKeyPairSync } from "node:crypto";
import type { ContainerDetails } from "../docker/docker-client.js";
import { gpuContainerConfig } from "../docker/gpu-devices.js";
import type { GpuInventory } from "../host/gpu-inventory.js";
import { parseTaskConfig, type RegistryAuth, type TaskConfig } from "../tasks/task-config.js";

/** Two AMD-style GPUs (render nodes as resource ids), as a fixture would give. */
export const TWO_AMD_GPUS: GpuInventory = {
  vendor: "amd",
  gpus: [
    {
      vendor: "amd",
      name: "MI300X",
      vramMiB: 196_608,
      id: "/dev/dri/renderD128",
      index: 0,
      driverVersion: "6.8.5",
    },
    {
      vendor: "amd",
      name: "MI300X",
      vramMiB: 196_608,
      id: "/dev/dri/renderD129",
      index: 1,
      driverVersion: "6.8.5",
    },
  ],
};

/** A valid OpenSSH ed25519 public key line (fresh for every call). */
export function sshEd25519PublicKey(comment = "test@host"): string {
  const { publicKey } = generateKeyPairSync("ed25519");
  const x = publicKey.export({ format: "jwk" }).x ?? "";
  const raw = Buffer.from(x, "base64url");
  const string = (b: Buffer): Buffer => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(b.length);
    return Buffer.concat([length, b]);
  };
  const blob = Buffer.concat([string(Buffer.from("ssh-ed25519")), string(raw)]);
  return `ssh-ed25519 ${blob.toString("base64")} ${comment}`;
}

let taskCounter = 0;

/** A valid submit body (`parseTaskConfig` input) with a unique id and name, plus overrides. */
export function taskBody(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const n = ++taskCounter;
  return { id: `task-${n}`, name: `job${n}`, image_name: "busybox:1.36", ...overrides };
}

/** A parsed config and credentials, as the API would hand them to `TaskRunner.submit`. */
export function taskConfig(overrides: Record<string, unknown> = {}): {
  config: TaskConfig;
  auth: RegistryAuth;
} {
  return parseTaskConfig(taskBody(overrides));
}

/** The inspected `HostConfig` of a container that holds `ids` (as the create spec sets it). */
export function hostConfigFor(
  inventory: GpuInventory,
  ids: readonly string[],
): ContainerDetails["hostConfig"] {
  const gpu = gpuContainerConfig(inventory, ids);
  return {
    Devices: gpu.devices.map((d) => ({ PathOnHost: d.pathOnHost, PathInContainer: d.pathInContainer })),
    DeviceRequests: gpu.deviceRequests.map((r) => ({ DeviceIDs: [...r.deviceIds] })),
  };
}
