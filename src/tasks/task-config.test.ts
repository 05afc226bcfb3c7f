import { describe, expect, it } from "vitest";
import {
  describeBodyError,
  InvalidTaskConfigError,
  parseTaskConfig,
  sameTaskConfig,
  type TaskConfig,
} from "./task-config.js";

/** The dstack server's submit body (test_client.py: test_submit_task), verbatim. */
const SERVER_EXAMPLE = `{"id":"c514f4ee-dfe7-472c-99a3-047178aafb5b","name":"test-0-0","registry_username":"user",
 "registry_password":"pass","image_name":"debian","container_user":"root","privileged":true,
 "gpu":1,"cpu":4.0,"memory":17179869184,"shm_size":1073741824,"network_mode":"bridge",
 "volumes":[{"backend":"gcp","name":"vol","volume_id":"vol-id","init_fs":true,"device_name":"/dev/sdv"}],
 "volume_mounts":[{"name":"vol","path":"/vol"}],
 "instance_mounts":[{"instance_path":"/mnt/nfs/home","path":"/home","optional":false}],
 "gpu_devices":[],"host_ssh_user":"dstack","host_ssh_keys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ host"],
 "container_ssh_keys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ project","ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user"]}`;

const MINIMAL = { id: "task-1", name: "job-0-0", image_name: "debian" };

const parse = (extra: Record<string, unknown>): TaskConfig =>
  parseTaskConfig({ ...MINIMAL, ...extra }).config;

function rejects(extra: Record<string, unknown>, message?: string | RegExp): void {
  const run = (): unknown => parseTaskConfig({ ...MINIMAL, ...extra });
  expect(run).toThrow(InvalidTaskConfigError);
  if (message !== undefined) expect(run).toThrow(message);
}

describe("parseTaskConfig: the server's body", () => {
  it("parses the server's example body", () => {
    const { config, auth } = parseTaskConfig(JSON.parse(SERVER_EXAMPLE));
    expect(auth).toEqual({ username: "user", password: "pass" });
    expect(config).toEqual({
      id: "c514f4ee-dfe7-472c-99a3-047178aafb5b",
      name: "test-0-0",
      image_name: "debian",
      container_user: "root",
      privileged: true,
      gpu: 1,
      cpu: 4,
      memory: 17179869184,
      shm_size: 1073741824,
      network_mode: "bridge",
      volumes: [{ backend: "gcp", name: "vol", volume_id: "vol-id", init_fs: true, device_name: "/dev/sdv" }],
      volume_mounts: [{ name: "vol", path: "/vol" }],
      // `optional` is sent by the server and ignored by the shim.
      instance_mounts: [{ instance_path: "/mnt/nfs/home", path: "/home" }],
      gpu_devices: [],
      host_ssh_user: "dstack",
      host_ssh_keys: [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ host",
      ],
      container_ssh_keys: [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ project",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user",
      ],
    });
  });

  it("keeps registry credentials out of the config", () => {
    const { config } = parseTaskConfig(JSON.parse(SERVER_EXAMPLE));
    expect(JSON.stringify(config)).not.toContain("pass");
    expect(Object.keys(config)).not.toContain("registry_username");
    expect(Object.keys(config)).not.toContain("registry_password");
  });

  it("accepts gpu -1 (all GPUs) and fractional cpu", () => {
    expect(parse({ gpu: -1, cpu: 0.5 })).toMatchObject({ gpu: -1, cpu: 0.5 });
  });

  it("keeps the taskshim extensions command and env", () => {
    const config = parse({ command: ["sh", "-c", "echo hi"], env: { FOO_1: "bar", _X: "" } });
    expect(config.command).toEqual(["sh", "-c", "echo hi"]);
    expect(config.env).toEqual({ FOO_1: "bar", _X: "" });
    expect(parse({ command: null, env: null })).not.toHaveProperty("command");
  });
});

describe("parseTaskConfig: Go decoding semantics", () => {
  it("gives missing fields their zero values and the documented defaults", () => {
    const { config, auth } = parseTaskConfig(MINIMAL);
    expect(auth).toEqual({ username: "", password: "" });
    expect(config).toEqual({
      id: "task-1",
      name: "job-0-0",
      image_name: "debian",
      container_user: "root",
      privileged: false,
      gpu: 0,
      cpu: 0,
      memory: 0,
      shm_size: 0,
      network_mode: "host",
      volumes: [],
      volume_mounts: [],
      instance_mounts: [],
      gpu_devices: [],
      host_ssh_user: "",
      host_ssh_keys: [],
      container_ssh_keys: [],
    });
  });

  it("treats JSON null like a missing field", () => {
    const body = {
      ...MINIMAL,
      registry_username: null,
      registry_password: null,
      container_user: null,
      privileged: null,
      gpu: null,
      cpu: null,
      memory: null,
      shm_size: null,
      network_mode: null,
      volumes: null,
      volume_mounts: null,
      instance_mounts: null,
      gpu_devices: null,
      host_ssh_user: null,
      host_ssh_keys: null,
      container_ssh_keys: null,
    };
    expect(parseTaskConfig(body)).toEqual(parseTaskConfig(MINIMAL));
  });

  it("treats null inside nested objects like a missing field (the server sends device_name: null)", () => {
    const config = parse({
      volumes: [{ backend: "aws", name: "data", volume_id: "vol-1", init_fs: null, device_name: null }],
    });
    expect(config.volumes).toEqual([
      { backend: "aws", name: "data", volume_id: "vol-1", init_fs: false, device_name: "" },
    ]);
  });

  it("ignores unknown fields at every level", () => {
    const config = parse({
      some_future_field: { nested: true },
      volumes: [{ name: "data", extra: 1 }],
      instance_mounts: [{ instance_path: "/srv", path: "/srv", optional: true, mode: "ro" }],
    });
    expect(config).not.toHaveProperty("some_future_field");
    expect(config.volumes[0]).not.toHaveProperty("extra");
    expect(config.instance_mounts).toEqual([{ instance_path: "/srv", path: "/srv" }]);
  });

  it("defaults an empty container_user to root and network_mode to host", () => {
    expect(parse({ container_user: "", network_mode: "" })).toMatchObject({
      container_user: "root",
      network_mode: "host",
    });
    expect(parse({ container_user: "1000:1000", network_mode: "host" })).toMatchObject({
      container_user: "1000:1000",
      network_mode: "host",
    });
  });

  it.each([
    [{ name: "n", image_name: "i" }, "empty id"],
    [{ id: "", name: "n", image_name: "i" }, "empty id"],
    [{ id: null, name: "n", image_name: "i" }, "empty id"],
    [{ id: "i", image_name: "i" }, "empty name"],
    [{ id: "i", name: "", image_name: "i" }, "empty name"],
    [{ id: "i", name: "n" }, "empty image_name"],
    [{ id: "i", name: "n", image_name: null }, "empty image_name"],
    [{}, "empty id"],
  ])("rejects %j with the wire message %j", (body, message) => {
    const run = (): unknown => parseTaskConfig(body);
    expect(run).toThrow(InvalidTaskConfigError);
    expect(run).toThrow(new InvalidTaskConfigError(message));
  });
});

describe("parseTaskConfig: hostile values", () => {
  const tooLong = (n: number): string => "a".repeat(n);

  it.each(["a/b", "../x", "..", ".", "/etc", "a\u0000b", "a\nb", "tâche", "task 1", "-x", tooLong(129)])(
    "rejects the id %j",
    (id) => rejects({ id }),
  );

  it("accepts a UUID id and an id of 128 characters", () => {
    expect(parse({ id: "66a886db-86db-4cf9-8c06-8984ad15dde2" }).id).toBe(
      "66a886db-86db-4cf9-8c06-8984ad15dde2",
    );
    expect(parse({ id: tooLong(128) }).id).toHaveLength(128);
  });

  it.each(["a/b", "..", "../etc", "x\u0000", "名前", "job:0", "a b", tooLong(102)])(
    "rejects the name %j",
    (name) => rejects({ name }),
  );

  it("accepts a name of 101 characters", () => {
    expect(parse({ name: tooLong(101) }).name).toHaveLength(101);
  });

  it.each(["debian\nlatest", "debian\u0000", tooLong(513)])("rejects the image_name %j", (image_name) =>
    rejects({ image_name }),
  );

  it.each(["vol", "", "./vol", "/a/../b", "/a/..", "/a//b", "/a/./b", "/a\u0000b", "/a\nb"])(
    "rejects the volume mount path %j",
    (path) => rejects({ volume_mounts: [{ name: "vol", path }] }),
  );

  it.each(["relative", "", "/srv/../etc", "/srv//data"])("rejects the instance_path %j", (instance_path) =>
    rejects({ instance_mounts: [{ instance_path, path: "/data" }] }),
  );

  it.each(["data", "/data/../etc", "/data/."])("rejects the instance mount path %j", (path) =>
    rejects({ instance_mounts: [{ instance_path: "/srv", path }] }),
  );

  it.each([
    { path_on_host: "dev/nvidia0", path_in_container: "/dev/nvidia0" },
    { path_on_host: "/dev/nvidia0", path_in_container: "/dev/../nvidia0" },
    { path_on_host: "", path_in_container: "/dev/nvidia0" },
  ])("rejects the gpu device %j", (device) => rejects({ gpu_devices: [device] }));

  it.each(["a/b", "../vol", "..", "", ".hidden", "vol\n"])("rejects the volume name %j", (name) => {
    rejects({ volumes: [{ backend: "aws", name, volume_id: "vol-1" }] });
    rejects({ volume_mounts: [{ name, path: "/vol" }] });
  });

  it.each([
    [{ memory: -1 }, "invalid memory: -1"],
    [{ shm_size: -1 }, "invalid shm_size: -1"],
    [{ memory: 1.5 }, undefined],
    [{ memory: 1e300 }, undefined],
    [{ cpu: -1 }, "invalid cpu: -1"],
    [{ cpu: 100_000 }, "invalid cpu: 100000"],
    [{ gpu: -2 }, "invalid gpu: -2"],
    [{ gpu: 100_000 }, "invalid gpu: 100000"],
    [{ gpu: 1.5 }, undefined],
  ])("rejects the resources %j", (extra, message) => rejects(extra, message));

  it.each(['{"cpu":1e400}', '{"cpu":-1e400}', '{"memory":1e400}', '{"gpu":1e400}'])(
    "rejects %s, which JSON.parse turns into an infinity",
    (text) => rejects(JSON.parse(text) as Record<string, unknown>),
  );

  it.each([
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ a\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl evil",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ a\r",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ a\u0000",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ a\u007f",
    "",
    "   ",
  ])("rejects the ssh key %j", (key) => {
    rejects({ host_ssh_keys: [key] });
    rejects({
      container_ssh_keys: [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ ok",
        key,
      ],
    });
  });

  it("keeps a quote in a key comment verbatim (the runner's argv is shell-quoted) and trims the line", () => {
    const config = parse({
      host_ssh_keys: [
        " ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ it's me ",
      ],
      container_ssh_keys: [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl o'k",
      ],
    });
    expect(config.host_ssh_keys).toEqual([
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ it's me",
    ]);
    expect(config.container_ssh_keys).toEqual([
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl o'k",
    ]);
  });

  it.each(["1ABC", "A-B", "A B", "", "A=B", "É", "A\nB"])("rejects the env name %j", (key) =>
    rejects({ env: { [key]: "v" } }),
  );

  it("rejects an env value with NUL and an empty command", () => {
    rejects({ env: { FOO: "a\u0000b" } });
    rejects({ command: [] }, "command must not be empty");
    rejects({ command: ["sh", "a\u0000b"] });
  });

  it.each([
    { network_mode: "none" },
    { network_mode: "container:x" },
    { container_user: "root;rm -rf /" },
    { container_user: "a:b:c" },
    { host_ssh_user: "../root" },
    { host_ssh_user: "9user" },
  ])("rejects %j", (extra) => rejects(extra));

  it("rejects lists longer than 256 entries", () => {
    rejects({
      host_ssh_keys: Array.from(
        { length: 257 },
        (_, i) => `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ k${i}`,
      ),
    });
    expect(
      parse({
        host_ssh_keys: Array.from(
          { length: 256 },
          (_, i) => `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ k${i}`,
        ),
      }).host_ssh_keys,
    ).toHaveLength(256);
  });
});

describe("parseTaskConfig: several bad fields", () => {
  it.each([
    [{ id: "a/b", name: "" }, "empty name"],
    [{ name: "a b", gpu: -2 }, /^invalid name/],
    [{ container_user: "a;b", network_mode: "none" }, /^invalid network_mode/],
    [{ container_user: "a;b", gpu: -2 }, "invalid gpu: -2 (use -1 for all, 0 for none, or 1..1024)"],
    [{ host_ssh_user: "9x", volumes: [{ name: "a/b" }] }, "invalid host_ssh_user"],
    [{ env: { "1A": "x" }, command: [] }, "command must not be empty"],
    [{ gpu: "x", id: "" }, 'Request body contains an invalid value for the "gpu" field'],
  ])("answers %j with the first message dstack's clients have always had", (extra, message) =>
    rejects(extra, message),
  );
});

describe("describeBodyError", () => {
  it.each([
    [{ gpu: "x" }, "gpu"],
    [{ cpu: "4" }, "cpu"],
    [{ privileged: "yes" }, "privileged"],
    [{ host_ssh_keys: "key" }, "host_ssh_keys"],
    [{ id: 5 }, "id"],
  ])("names the field of a type mismatch in %j", (body, field) => {
    expect(describeBodyError(body)).toBe(`Request body contains an invalid value for the "${field}" field`);
    expect(() => parseTaskConfig({ ...MINIMAL, ...body })).toThrow(
      `Request body contains an invalid value for the "${field}" field`,
    );
  });

  it("names a nested field", () => {
    expect(describeBodyError({ volumes: [{ name: 7 }] })).toContain('"volumes.');
  });

  it.each([null, [], "text", 42])("rejects the non-object body %j", (body) => {
    expect(describeBodyError(body)).toBe("Request body must be a JSON object");
    expect(() => parseTaskConfig(body)).toThrow(InvalidTaskConfigError);
  });

  it("returns undefined for a well-shaped body, even with unknown fields", () => {
    expect(describeBodyError(JSON.parse(SERVER_EXAMPLE))).toBeUndefined();
    expect(describeBodyError({ unknown: [1, 2, 3] })).toBeUndefined();
  });
});

describe("sameTaskConfig", () => {
  const base = parseTaskConfig(JSON.parse(SERVER_EXAMPLE)).config;
  const reorder = <T extends object>(value: T): T => Object.fromEntries(Object.entries(value).reverse()) as T;

  it("ignores key order, also inside nested objects", () => {
    const shuffled: TaskConfig = {
      ...reorder(base),
      volumes: base.volumes.map(reorder),
      instance_mounts: base.instance_mounts.map(reorder),
    };
    expect(Object.keys(shuffled)).not.toEqual(Object.keys(base));
    expect(sameTaskConfig(base, shuffled)).toBe(true);
  });

  it("sees a changed value", () => {
    expect(sameTaskConfig(base, { ...base, gpu: 2 })).toBe(false);
    expect(sameTaskConfig(base, { ...base, volume_mounts: [{ name: "vol", path: "/other" }] })).toBe(false);
  });

  it("does not ignore the order of list items", () => {
    expect(
      sameTaskConfig(base, {
        ...base,
        container_ssh_keys: [
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user",
          "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ project",
        ],
      }),
    ).toBe(false);
  });
});
