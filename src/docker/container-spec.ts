import type { TaskConfig } from "../tasks/task-config.js";
import type { GpuContainerConfig } from "./gpu-devices.js";
import {
  LABEL_IS_TASK,
  LABEL_OWNER,
  LABEL_TASK_ID,
  type BindMount,
  type ContainerSpec,
  type DeviceMapping,
} from "./docker-client.js";

/** Where dstack-runner's dir and binary appear inside every task container. */
export const CONTAINER_RUNNER_DIR = "/tmp/runner";
export const CONTAINER_RUNNER_BINARY = "/usr/local/bin/dstack-runner";

/** Host-wide settings that shape every container (from the shim's flags). */
export interface ContainerParams {
  readonly runnerBinaryPath: string;
  readonly runnerHttpPort: number;
  readonly runnerSshPort: number;
  readonly runnerLogLevel: string;
  readonly runnerSshLogLevel: string;
  /** NAME=value pairs copied from the shim's environment. */
  readonly baseEnv: readonly string[];
  readonly privileged: boolean;
  readonly pjrtDevice: string;
  readonly volumeMountRoot: string;
  /** Whether /dev/infiniband exists on this host. */
  readonly infiniband: boolean;
}

/** What of a task's configuration shapes its container: the fields the engine sees. */
export type ContainerTaskConfig = Pick<
  TaskConfig,
  | "id"
  | "image_name"
  | "container_user"
  | "privileged"
  | "cpu"
  | "memory"
  | "shm_size"
  | "network_mode"
  | "volume_mounts"
  | "instance_mounts"
  | "gpu_devices"
  | "container_ssh_keys"
  | "command"
  | "env"
>;

/** Quotes one word for a POSIX shell, so no key or argument can break out of it. */
export function shellQuote(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * The `/bin/sh -c` script that installs sshd if the image lacks it and starts dstack-runner
 * (dstack-shim's `DockerShellCommands`). Unlike the original, keys are shell-quoted.
 */
export function runnerLaunchScript(
  config: Pick<ContainerTaskConfig, "network_mode" | "container_ssh_keys">,
  params: ContainerParams,
): string {
  const prepare = [
    ": ",
    "unset LD_LIBRARY_PATH",
    "unset LD_PRELOAD",
    'exists() { command -v "$1" > /dev/null 2>&1; }',
    "install_pkg() { NAME=Distribution; test -f /etc/os-release && . /etc/os-release; echo $NAME not supported; exit 11; }",
    'if exists apt-get; then install_pkg() { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$1"; }; fi',
    'if exists yum; then install_pkg() { yum install -y "$1"; }; fi',
    'if exists apk; then install_pkg() { apk add -U "$1"; }; fi',
    "if ! exists sshd; then install_pkg openssh-server; fi",
    ": ",
  ].join(" && ");
  const runner = [
    CONTAINER_RUNNER_BINARY,
    "--log-level",
    shellQuote(params.runnerLogLevel),
    "start",
    "--temp-dir",
    CONTAINER_RUNNER_DIR,
    "--http-port",
    String(params.runnerHttpPort),
    "--ssh-port",
    String(params.runnerSshPort),
    ...(config.network_mode === "host" ? ["--http-address", "localhost"] : []),
    ...config.container_ssh_keys.flatMap((key) => ["--ssh-authorized-key", shellQuote(key)]),
    ...(params.runnerSshLogLevel ? ["--ssh-log-level", shellQuote(params.runnerSshLogLevel)] : []),
  ].join(" ");
  return `( ${prepare} ) && ${runner}`;
}

/** The one device of InfiniBand, the same path on the host and in the container. */
const INFINIBAND: DeviceMapping = {
  pathOnHost: "/dev/infiniband",
  pathInContainer: "/dev/infiniband",
  cgroupPermissions: "rwm",
};

/**
 * The container of a task (the one dstack-shim creates): labels, mounts, resources, network,
 * GPUs. The adapter turns it into the Engine API's create body (`engine-create-body.ts`).
 */
export function buildContainerSpec(input: {
  readonly config: ContainerTaskConfig;
  readonly containerName: string;
  readonly runnerDir: string;
  readonly params: ContainerParams;
  /** The GPU setup, only when the task holds GPUs. */
  readonly gpu: GpuContainerConfig | undefined;
  /** The creating home's identity, written as the owner label. */
  readonly owner: string;
}): ContainerSpec {
  const { config, params, gpu } = input;
  const ports = [params.runnerHttpPort, params.runnerSshPort];
  const mounts: BindMount[] = [{ source: input.runnerDir, target: CONTAINER_RUNNER_DIR }];
  if (!config.command) {
    mounts.push({ source: params.runnerBinaryPath, target: CONTAINER_RUNNER_BINARY });
  }
  for (const m of config.volume_mounts) {
    mounts.push({ source: `${params.volumeMountRoot}/${m.name}`, target: m.path });
  }
  for (const m of config.instance_mounts) {
    mounts.push({ source: m.instance_path, target: m.path });
  }

  const devices: DeviceMapping[] = [];
  // `gpu` is given only when the task holds GPUs; explicit gpu_devices replace the vendor setup.
  const vendorGpu = gpu && config.gpu_devices.length === 0 ? gpu : undefined;
  if (gpu && config.gpu_devices.length > 0) {
    devices.push(
      ...config.gpu_devices.map((d) => ({
        pathOnHost: d.path_on_host,
        pathInContainer: d.path_in_container,
        cgroupPermissions: "rwm",
      })),
    );
  } else if (vendorGpu) {
    devices.push(...vendorGpu.devices);
    mounts.push(...vendorGpu.mounts);
  }
  if (params.infiniband) devices.push(INFINIBAND);

  const env = [
    ...params.baseEnv,
    ...(params.pjrtDevice ? [`PJRT_DEVICE=${params.pjrtDevice}`] : []),
    ...(vendorGpu?.env ?? []),
    ...Object.entries(config.env ?? {}).map(([k, v]) => `${k}=${v}`),
  ];

  const command = config.command
    ? { entrypoint: [...config.command.slice(0, 1)], cmd: config.command.slice(1) }
    : { entrypoint: ["/bin/sh", "-c"], cmd: [runnerLaunchScript(config, params)] };

  return {
    name: input.containerName,
    image: config.image_name,
    ...command,
    env,
    user: config.container_user,
    labels: { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: config.id, [LABEL_OWNER]: input.owner },
    networkMode: config.network_mode,
    exposedPorts: ports,
    publishedPorts: config.network_mode === "bridge" ? ports : [],
    privileged: config.privileged || params.privileged,
    mounts,
    devices,
    gpuRequests: vendorGpu?.deviceRequests ?? [],
    capAdd: vendorGpu?.capAdd ?? [],
    securityOpt: vendorGpu?.securityOpt ?? [],
    ...(vendorGpu?.ipcMode ? { ipcMode: vendorGpu.ipcMode } : {}),
    ...(vendorGpu?.runtime ? { runtime: vendorGpu.runtime } : {}),
    shmSize: config.shm_size,
    cpus: config.cpu,
    memory: config.memory,
    memlockUnlimited: params.infiniband,
  };
}
