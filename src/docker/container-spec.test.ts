import { execFileSync } from "node:child_process";
import type Docker from "dockerode";
import { describe, expect, it } from "vitest";
import {
  buildContainerSpec,
  runnerLaunchScript,
  shellQuote,
  type ContainerParams,
  type ContainerTaskConfig,
} from "./container-spec.js";
import { engineCreateBody } from "./engine-create-body.js";

const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ";

const params: ContainerParams = {
  runnerBinaryPath: "/usr/local/bin/dstack-runner",
  runnerHttpPort: 10999,
  runnerSshPort: 10022,
  runnerLogLevel: "info",
  runnerSshLogLevel: "",
  baseEnv: ["HTTP_PROXY=http://proxy:3128"],
  privileged: false,
  pjrtDevice: "",
  volumeMountRoot: "/mnt/disks/dstack-volumes",
  infiniband: false,
};

/** A task's container settings as a parsed submit body with only id and image gives them. */
function config(extra: Partial<ContainerTaskConfig> = {}): ContainerTaskConfig {
  return {
    id: "t-1",
    image_name: "ubuntu:22.04",
    container_user: "root",
    privileged: false,
    cpu: 0,
    memory: 0,
    shm_size: 0,
    network_mode: "host",
    volume_mounts: [],
    instance_mounts: [],
    gpu_devices: [],
    container_ssh_keys: [],
    ...extra,
  };
}

type HostConfig = Docker.HostConfig & { Mounts: Docker.MountConfig };

function spec(extra: Partial<ContainerTaskConfig> = {}, overrides: Partial<ContainerParams> = {}) {
  const built = buildContainerSpec({
    config: config(extra),
    containerName: "job-abcd1234",
    runnerDir: "/home/runners/job-abcd1234/runner",
    params: { ...params, ...overrides },
    gpu: undefined,
    owner: "home-1",
  });
  const body = engineCreateBody(built);
  return { name: built.name, spec: built, body, host: body.HostConfig as HostConfig };
}

describe("buildContainerSpec", () => {
  it("labels the container (dstack's two labels and the owner home), never restarts or auto-removes it, and names it", () => {
    const { name, body, host } = spec();
    expect(name).toBe("job-abcd1234");
    expect(body.Labels).toEqual({
      "ai.dstack.shim.is-task": "true",
      "ai.dstack.shim.task-id": "t-1",
      "ai.dstack.taskshim.owner": "home-1",
    });
    expect(host.RestartPolicy).toEqual({ Name: "no" });
    expect(host.AutoRemove).toBe(false);
    expect(body.User).toBe("root");
    expect(body.Env).toEqual(["HTTP_PROXY=http://proxy:3128"]);
  });

  it("mounts the runner dir, the runner binary, volumes and instance mounts in that order", () => {
    const { host } = spec({
      volume_mounts: [{ name: "data", path: "/data" }],
      instance_mounts: [{ instance_path: "/mnt/nfs", path: "/nfs" }],
    });
    expect(host.Mounts.map((m) => [m.Source, m.Target])).toEqual([
      ["/home/runners/job-abcd1234/runner", "/tmp/runner"],
      ["/usr/local/bin/dstack-runner", "/usr/local/bin/dstack-runner"],
      ["/mnt/disks/dstack-volumes/data", "/data"],
      ["/mnt/nfs", "/nfs"],
    ]);
  });

  it("runs a command instead of the launch script, without the runner binary mount", () => {
    const { body, host } = spec({ command: ["python", "-c", "print(1)"], env: { A: "b" } });
    expect(body.Entrypoint).toEqual(["python"]);
    expect(body.Cmd).toEqual(["-c", "print(1)"]);
    expect(body.Env).toContain("A=b");
    expect(host.Mounts.map((m) => m.Target)).not.toContain("/usr/local/bin/dstack-runner");
  });

  it("binds the runner ports to ephemeral 127.0.0.1 ports only in bridge mode", () => {
    expect(spec().host.PortBindings).toBeUndefined();
    expect(spec().host.NetworkMode).toBe("host");
    const bridge = spec({ network_mode: "bridge" }).host;
    expect(bridge.NetworkMode).toBe("bridge");
    expect(bridge.PortBindings).toEqual({
      "10999/tcp": [{ HostIp: "127.0.0.1", HostPort: "" }],
      "10022/tcp": [{ HostIp: "127.0.0.1", HostPort: "" }],
    });
  });

  it("sets cpu, memory and an exec /dev/shm only when asked", () => {
    const plain = spec().host;
    expect(plain.NanoCpus).toBeUndefined();
    expect(plain.Memory).toBeUndefined();
    expect(plain.Tmpfs).toBeUndefined();
    const sized = spec({ cpu: 1.5, memory: 1024, shm_size: 2048 }).host;
    expect(sized.NanoCpus).toBe(1_500_000_000);
    expect(sized.Memory).toBe(1024);
    expect(sized.ShmSize).toBe(2048);
    expect(sized.Tmpfs).toEqual({ "/dev/shm": "exec,size=2048" });
  });

  it("makes the container privileged when the task or the shim asks", () => {
    expect(spec().host.Privileged).toBe(false);
    expect(spec({ privileged: true }).host.Privileged).toBe(true);
    expect(spec({}, { privileged: true }).host.Privileged).toBe(true);
  });

  it("uses explicit gpu_devices instead of the vendor setup when the task holds GPUs", () => {
    const built = buildContainerSpec({
      config: config({
        gpu_devices: [{ path_on_host: "/dev/nvidia0", path_in_container: "/dev/nvidia0" }],
      }),
      containerName: "job-abcd1234",
      runnerDir: "/r",
      params,
      owner: "home-1",
      gpu: {
        deviceRequests: [{ deviceIds: ["GPU-1"], capabilities: [["gpu"]] }],
        devices: [],
        mounts: [],
        capAdd: [],
        securityOpt: [],
        env: [],
      },
    });
    const host = engineCreateBody(built).HostConfig as HostConfig;
    expect(host.DeviceRequests).toBeUndefined();
    expect(host.Devices).toEqual([
      { PathOnHost: "/dev/nvidia0", PathInContainer: "/dev/nvidia0", CgroupPermissions: "rwm" },
    ]);
  });

  it("passes infiniband and an unlimited memlock when the host has it", () => {
    const host = spec({}, { infiniband: true }).host;
    expect(host.Devices).toEqual([
      { PathOnHost: "/dev/infiniband", PathInContainer: "/dev/infiniband", CgroupPermissions: "rwm" },
    ]);
    expect(host.Ulimits).toEqual([{ Name: "memlock", Soft: -1, Hard: -1 }]);
  });
});

describe("runnerLaunchScript", () => {
  it("adds --http-address localhost only in host mode and quotes every key", () => {
    const key = `${KEY} bob's key; rm -rf /`;
    const host = runnerLaunchScript(config({ container_ssh_keys: [key] }), params);
    expect(host).toContain("--http-address localhost");
    expect(host).toContain(`--ssh-authorized-key ${shellQuote(key)}`);
    expect(runnerLaunchScript(config({ network_mode: "bridge" }), params)).not.toContain("--http-address");
  });

  it("is a script sh accepts, whose keys reach the runner as single words", () => {
    const key = `${KEY} it's $(whoami) \`id\``;
    const script = runnerLaunchScript(config({ container_ssh_keys: [key] }), {
      ...params,
      runnerSshLogLevel: "debug",
    });
    // Replace the runner with printf and sshd detection with true to run the script for real.
    const probe = script
      .replace("/usr/local/bin/dstack-runner", "printf '%s\\n'")
      .replace("if ! exists sshd; then install_pkg openssh-server; fi", "true");
    const out = execFileSync("/bin/sh", ["-c", probe], { encoding: "utf8" }).trimEnd().split("\n");
    expect(out).toContain(key);
    expect(out.slice(-2)).toEqual(["--ssh-log-level", "debug"]);
  });
});

describe("shellQuote", () => {
  it("quotes single quotes so the shell reads the word back unchanged", () => {
    for (const word of ["plain", "it's", "'", "", "a b\tc", "$HOME `x` \\"]) {
      expect(execFileSync("/bin/sh", ["-c", `printf %s ${shellQuote(word)}`], { encoding: "utf8" })).toBe(
        word,
      );
    }
  });
});
