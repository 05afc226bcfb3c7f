import { describe, expect, it } from "vitest";
import { parseTaskConfig } from "../tasks/task-config.js";
import {
  buildSubmitBody,
  InvalidSubmitFlagError,
  nameFromImage,
  parseEnvFlags,
  parseMountFlag,
  type SubmitFlags,
} from "./submit-body.js";

const options = { newId: () => "generated-id", env: (name: string) => ({ HOME: "/root" })[name] };
const build = (flags: SubmitFlags, file?: Record<string, unknown>) => buildSubmitBody(file, flags, options);

describe("buildSubmitBody from flags", () => {
  it("turns every flag into the wire field, and the shim accepts the result", () => {
    const body = build({
      id: "t-1",
      name: "tst-job",
      image: "registry.example.com/team/app:v1",
      command: ["sh", "-c", "echo $FOO"],
      env: ["FOO=bar=baz", "HOME"],
      gpu: "2",
      cpu: "1.5",
      memory: "4GiB",
      shm: "1GiB",
      mount: ["/data:/data", "/srv/cache:/cache"],
      network: "bridge",
      registryUser: "user",
      registryPassword: "secret",
      privileged: true,
    });
    expect(body).toEqual({
      id: "t-1",
      name: "tst-job",
      image_name: "registry.example.com/team/app:v1",
      command: ["sh", "-c", "echo $FOO"],
      env: { FOO: "bar=baz", HOME: "/root" },
      gpu: 2,
      cpu: 1.5,
      memory: 4 * 1024 ** 3,
      shm_size: 1024 ** 3,
      instance_mounts: [
        { instance_path: "/data", path: "/data" },
        { instance_path: "/srv/cache", path: "/cache" },
      ],
      network_mode: "bridge",
      registry_username: "user",
      registry_password: "secret",
      privileged: true,
    });
    const { config, auth } = parseTaskConfig(body);
    expect(config.memory).toBe(4 * 1024 ** 3);
    expect(auth).toEqual({ username: "user", password: "secret" });
  });

  it("generates an id and derives a name from the image when none is given", () => {
    const body = build({ image: "ghcr.io/acme/train:v2" });
    expect(body).toEqual({ id: "generated-id", name: "train", image_name: "ghcr.io/acme/train:v2" });
    expect(() => parseTaskConfig(body)).not.toThrow();
  });

  it("sets container_user only when --user is given, and takes 0 as a size without a unit", () => {
    expect(build({ image: "a", user: "1000:1000" }).container_user).toBe("1000:1000");
    expect(build({ image: "a" })).not.toHaveProperty("container_user");
    expect(build({ image: "a", memory: "0" }).memory).toBe(0);
  });

  it("accepts -1 and 0 GPUs", () => {
    expect(build({ image: "a", gpu: "-1" }).gpu).toBe(-1);
    expect(build({ image: "a", gpu: "0" }).gpu).toBe(0);
  });

  it("names the flag that is wrong", () => {
    const cases: [SubmitFlags, RegExp][] = [
      [{}, /no image/],
      [{ image: "a", memory: "4XB" }, /^--memory: invalid size "4XB"/],
      [{ image: "a", shm: "-1" }, /^--shm: invalid size/],
      [{ image: "a", memory: "4" }, /^--memory: give a unit, like 4GiB or 4MiB/],
      [{ image: "a", memory: "4 GB" }, /^--memory: write the size as one word, like 4GiB/],
      [{ image: "a", user: "a b" }, /^--user:/],
      [{ image: "a", gpu: "two" }, /^--gpu:/],
      [{ image: "a", gpu: "-2" }, /^--gpu:/],
      [{ image: "a", gpu: "1.5" }, /^--gpu:/],
      [{ image: "a", cpu: "NaN" }, /^--cpu:/],
      [{ image: "a", cpu: "-1" }, /^--cpu:/],
      [{ image: "a", cpu: "" }, /^--cpu:/],
      [{ image: "a", network: "none" }, /^--network:/],
      [{ image: "a", env: ["1X=a"] }, /^--env: invalid variable name/],
      [{ image: "a", env: ["UNSET_IN_THIS_SHELL"] }, /^--env: UNSET_IN_THIS_SHELL is not set/],
      [{ image: "a", mount: ["/only-one"] }, /^--mount:/],
      [{ image: "a", mount: ["relative:/x"] }, /^--mount:/],
      [{ image: "a", mount: ["/a:/b:/c"] }, /^--mount:/],
    ];
    for (const [flags, message] of cases) {
      expect(() => build(flags), JSON.stringify(flags)).toThrow(InvalidSubmitFlagError);
      expect(() => build(flags), JSON.stringify(flags)).toThrow(message);
    }
  });
});

describe("buildSubmitBody from a file", () => {
  const file = {
    id: "from-file",
    name: "tst-file",
    image_name: "busybox:1",
    env: { A: "1" },
    instance_mounts: [{ instance_path: "/x", path: "/x" }],
    gpu: 1,
  };

  it("sends the file as is", () => {
    expect(build({}, file)).toEqual(file);
  });

  it("lets flags override fields, and adds --env and --mount to the file's", () => {
    const body = build({ image: "busybox:2", gpu: "0", env: ["B=2", "A=override"], mount: ["/y:/y"] }, file);
    expect(body).toMatchObject({
      id: "from-file",
      image_name: "busybox:2",
      gpu: 0,
      env: { A: "override", B: "2" },
      instance_mounts: [
        { instance_path: "/x", path: "/x" },
        { instance_path: "/y", path: "/y" },
      ],
    });
  });

  it("fills a missing id and name", () => {
    expect(build({}, { image_name: "busybox:1" })).toEqual({
      id: "generated-id",
      name: "busybox",
      image_name: "busybox:1",
    });
  });

  it("refuses a file env that is not a map when --env adds to it", () => {
    expect(() => build({ env: ["A=1"] }, { image_name: "a", env: ["A=1"] })).toThrow(/env in --file/);
  });
});

describe("flag parsers", () => {
  it("splits --env at the first =", () => {
    expect(parseEnvFlags(["A=", "B=x=y"], () => undefined)).toEqual({ A: "", B: "x=y" });
  });

  it("reads --mount as host:container", () => {
    expect(parseMountFlag("/host/dir:/in/container")).toEqual({
      instance_path: "/host/dir",
      path: "/in/container",
    });
  });

  it("derives a valid task name from any image reference", () => {
    expect(nameFromImage("busybox")).toBe("busybox");
    expect(nameFromImage("127.0.0.1:5000/team/app:v1")).toBe("app");
    expect(nameFromImage("repo/img@sha256:abcd")).toBe("img");
    expect(nameFromImage("__")).toBe("task");
  });
});
