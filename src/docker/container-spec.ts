import type { TaskConfig } from "../tasks/task-config.js";
import type { GpuContainerConfig } from "./gpu-devices.js";
import { LABEL_IS_TASK, LABEL_OWNER, LABEL_TASK_ID, type ContainerCreateSpec } from "./docker-client.js";

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

interface Mount {
  Type: "bind";
  Source: string;
  Target: string;
}

/**
 * The Engine API create body for a task (the one dstack-shim creates): labels, mounts, resources,
 * network, GPUs. Restart policy "no" and never auto-remove: the exit code must outlive us.
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
}): ContainerCreateSpec {
  const { config, params, gpu } = input;
  const ports = [params.runnerHttpPort, params.runnerSshPort];
  const mounts: Mount[] = [{ Type: "bind", Source: input.runnerDir, Target: CONTAINER_RUNNER_DIR }];
  if (!config.command) {
    mounts.push({ Type: "bind", Source: params.runnerBinaryPath, Target: CONTAINER_RUNNER_BINARY });
  }
  for (const m of config.volume_mounts) {
    mounts.push({ Type: "bind", Source: `${params.volumeMountRoot}/${m.name}`, Target: m.path });
  }
  for (const m of config.instance_mounts) {
    mounts.push({ Type: "bind", Source: m.instance_path, Target: m.path });
  }

  const devices: { PathOnHost: string; PathInContainer: string; CgroupPermissions: string }[] = [];
  let gpuHostConfig: Record<string, unknown> = {};
  let gpuEnv: readonly string[] = [];
  // `gpu` is given only when the task holds GPUs; explicit gpu_devices replace the vendor setup.
  if (gpu && config.gpu_devices.length > 0) {
    devices.push(
      ...config.gpu_devices.map((d) => ({
        PathOnHost: d.path_on_host,
        PathInContainer: d.path_in_container,
        CgroupPermissions: "rwm",
      })),
    );
  } else if (gpu) {
    devices.push(...gpu.devices);
    mounts.push(...gpu.mounts);
    gpuEnv = gpu.env;
    gpuHostConfig = {
      ...(gpu.deviceRequests.length > 0 ? { DeviceRequests: gpu.deviceRequests } : {}),
      ...(gpu.capAdd.length > 0 ? { CapAdd: gpu.capAdd } : {}),
      ...(gpu.securityOpt.length > 0 ? { SecurityOpt: gpu.securityOpt } : {}),
      ...(gpu.ipcMode ? { IpcMode: gpu.ipcMode } : {}),
      ...(gpu.runtime ? { Runtime: gpu.runtime } : {}),
    };
  }
  if (params.infiniband) {
    devices.push({
      PathOnHost: "/dev/infiniband",
      PathInContainer: "/dev/infiniband",
      CgroupPermissions: "rwm",
    });
  }

  const env = [
    ...params.baseEnv,
    ...(params.pjrtDevice ? [`PJRT_DEVICE=${params.pjrtDevice}`] : []),
    ...gpuEnv,
    ...Object.entries(config.env ?? {}).map(([k, v]) => `${k}=${v}`),
  ];

  const command = config.command
    ? { Entrypoint: [config.command[0]], Cmd: config.command.slice(1) }
    : { Entrypoint: ["/bin/sh", "-c"], Cmd: [runnerLaunchScript(config, params)] };

  const body: Record<string, unknown> = {
    Image: config.image_name,
    ...command,
    Env: env,
    User: config.container_user,
    ExposedPorts: Object.fromEntries(ports.map((p) => [`${p}/tcp`, {}])),
    Labels: { [LABEL_IS_TASK]: "true", [LABEL_TASK_ID]: config.id, [LABEL_OWNER]: input.owner },
    HostConfig: {
      Privileged: config.privileged || params.privileged,
      NetworkMode: config.network_mode,
      ...(config.network_mode === "bridge"
        ? {
            PortBindings: Object.fromEntries(
              ports.map((p) => [`${p}/tcp`, [{ HostIp: "127.0.0.1", HostPort: "" }]]),
            ),
          }
        : {}),
      Mounts: mounts,
      RestartPolicy: { Name: "no" },
      AutoRemove: false,
      ...(config.shm_size > 0
        ? { ShmSize: config.shm_size, Tmpfs: { "/dev/shm": `exec,size=${config.shm_size}` } }
        : {}),
      ...(config.cpu > 0 ? { NanoCpus: Math.round(config.cpu * 1e9) } : {}),
      ...(config.memory > 0 ? { Memory: config.memory } : {}),
      ...(devices.length > 0 ? { Devices: devices } : {}),
      ...(params.infiniband ? { Ulimits: [{ Name: "memlock", Soft: -1, Hard: -1 }] } : {}),
      ...gpuHostConfig,
    },
  };
  return { name: input.containerName, body };
}
