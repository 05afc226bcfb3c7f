import { execFileSync } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { Task } from "../tasks/task.js";
import { parseTaskConfig, type TaskConfig } from "../tasks/task-config.js";
import { FileTooLargeError } from "./bounded-read.js";
import {
  CorruptTaskStateError,
  decodeTaskState,
  encodedTaskStateBytes,
  encodeTaskState,
  readTaskState,
  TASK_STATE_FILE,
  TASK_STATE_MAX_BYTES,
  TaskStateTooLargeError,
  UnsupportedTaskStateVersionError,
  writeTaskState,
} from "./task-state-file.js";

const ID = "66a886db-86db-4cf9-8c06-8984ad15dde2";
const PASSWORD = "s3cr3t-registry-pw";
const BOOT_ID = "2f4e1c7a-0b7d-4b53-9d0e-3e1f0c2b9a11";

const { config: CONFIG, auth: AUTH } = parseTaskConfig({
  id: ID,
  name: "vllm-0-0",
  registry_username: "robot$puller",
  registry_password: PASSWORD,
  image_name: "registry.example.com/team/vllm:0.6",
  privileged: true,
  gpu: 2,
  cpu: 7.5,
  memory: 17179869184,
  shm_size: 1073741824,
  network_mode: "bridge",
  volumes: [{ backend: "aws", name: "data", volume_id: "vol-0abc", init_fs: true, device_name: "/dev/sdf" }],
  volume_mounts: [{ name: "data", path: "/data" }],
  instance_mounts: [{ instance_path: "/mnt/nfs", path: "/nfs" }],
  gpu_devices: [{ path_on_host: "/dev/nvidia0", path_in_container: "/dev/nvidia0" }],
  host_ssh_user: "ubuntu",
  host_ssh_keys: [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ user@host",
  ],
  container_ssh_keys: [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ project",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ user",
  ],
  command: ["sh", "-c", "sleep infinity"],
  env: { HF_TOKEN: "not-a-registry-secret" },
});

/** What `read` threw (it must throw). */
function thrownBy(read: () => unknown): unknown {
  try {
    read();
  } catch (error) {
    return error;
  }
  throw new Error("expected a throw");
}

function makeTask(overrides: Partial<Task> = {}): Task {
  return {
    id: ID,
    status: "running",
    terminationReason: "",
    terminationMessage: "",
    config: CONFIG,
    containerName: "vllm-0-0-cff1b8da",
    containerId: "0123456789abcdef",
    ports: [{ host: 32768, container: 10022 }],
    gpuIds: ["GPU-a", "GPU-b"],
    taskDir: "/somewhere",
    cleanedUp: false,
    startInFlight: false,
    ...overrides,
  };
}

/** A task.json exactly as dstack-shim (#4220) writes it: Go field names, nil slices as null, no extras. */
const DSTACK_SHIM_V1 =
  `{"version":1,"id":"${ID}","config":{"id":"${ID}","name":"vllm-0-0","registry_username":"",` +
  `"registry_password":"","image_name":"dstackai/base:py3.12-0.7-cuda-12.1","container_user":"root",` +
  `"privileged":false,"gpu":-1,"cpu":0,"memory":0,"shm_size":0,"network_mode":"host","volumes":null,` +
  `"volume_mounts":[{"name":"data","path":"/data"}],"instance_mounts":null,"gpu_devices":null,` +
  `"host_ssh_user":"ubuntu","host_ssh_keys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ user@host"],` +
  `"container_ssh_keys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDTp2Jhb0wgYZiq9AErq068kD4ch2hRgtZixNUo1HbJZ project"]},` +
  `"termination_reason":"","termination_message":"","cleaned_up":false}\n`;

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "task-state-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("task.json round trip", () => {
  it("keeps the id, config, reason, message, cleanup flag, status, exit code and boot id", async () => {
    const task = makeTask({
      status: "terminated",
      terminationReason: "terminated_by_user",
      terminationMessage: "stopped\nby the user",
      cleanedUp: true,
      exitCode: 137,
    });
    await writeTaskState(dir, task, BOOT_ID);
    const state = readTaskState(dir);
    expect(state).toEqual({
      version: 1,
      id: ID,
      config: CONFIG,
      termination_reason: "terminated_by_user",
      termination_message: "stopped\nby the user",
      cleaned_up: true,
      status: "terminated",
      exit_code: 137,
      boot_id: BOOT_ID,
    });
  });

  it("writes the file 0600, ending in a newline, with no temp file left", async () => {
    await writeTaskState(dir, makeTask(), BOOT_ID);
    expect(await readdir(dir)).toEqual([TASK_STATE_FILE]);
    expect((await stat(join(dir, TASK_STATE_FILE))).mode & 0o777).toBe(0o600);
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toMatch(/^\{.*\}\n$/s);
  });

  it("writes the v1 fields first, as dstack-shim does, and leaves out what the container knows", async () => {
    await writeTaskState(dir, makeTask(), BOOT_ID);
    const raw = JSON.parse(await readFile(join(dir, TASK_STATE_FILE), "utf8")) as Record<string, unknown>;
    expect(Object.keys(raw).slice(0, 6)).toEqual([
      "version",
      "id",
      "config",
      "termination_reason",
      "termination_message",
      "cleaned_up",
    ]);
    expect(raw.version).toBe(1);
    for (const key of ["container_id", "containerId", "gpu_ids", "gpuIds", "ports"])
      expect(raw).not.toHaveProperty(key);
  });

  it("never writes registry credentials, even when the config carries them", async () => {
    const leaky = {
      ...CONFIG,
      registry_username: AUTH.username,
      registry_password: AUTH.password,
    } as TaskConfig;
    await writeTaskState(dir, makeTask({ config: leaky }), BOOT_ID);
    const text = await readFile(join(dir, TASK_STATE_FILE), "utf8");
    expect(AUTH.password).toBe(PASSWORD);
    expect(text).not.toContain(PASSWORD);
    expect(text).not.toContain("robot$puller");
    const raw = JSON.parse(text) as { config: Record<string, unknown> };
    // dstack-shim writes the keys blanked, so an old shim reading our file sees the same shape.
    expect(raw.config.registry_username).toBe("");
    expect(raw.config.registry_password).toBe("");
    expect(readTaskState(dir).config).toEqual(CONFIG);
  });

  it("keeps the created, started and finished times as ISO 8601, and none when unknown", () => {
    const times = {
      createdAt: Date.UTC(2026, 0, 2, 3, 4, 5, 6),
      startedAt: Date.UTC(2026, 0, 2, 3, 5),
      finishedAt: Date.UTC(2026, 0, 2, 4),
    };
    const text = encodeTaskState(makeTask(times), BOOT_ID);
    expect(JSON.parse(text)).toMatchObject({
      created_at: "2026-01-02T03:04:05.006Z",
      started_at: "2026-01-02T03:05:00.000Z",
      finished_at: "2026-01-02T04:00:00.000Z",
    });
    expect(decodeTaskState(text)).toMatchObject({
      created_at: "2026-01-02T03:04:05.006Z",
      started_at: "2026-01-02T03:05:00.000Z",
      finished_at: "2026-01-02T04:00:00.000Z",
    });
    const none = decodeTaskState(encodeTaskState(makeTask({ status: "pending" }), BOOT_ID));
    expect(none.started_at).toBeUndefined();
    expect(none.finished_at).toBeUndefined();
    expect("started_at" in none).toBe(false);
    expect("finished_at" in none).toBe(false);
  });

  it("drops a time it cannot read instead of keeping it", () => {
    const raw = JSON.parse(encodeTaskState(makeTask(), BOOT_ID)) as Record<string, unknown>;
    const decoded = decodeTaskState(
      JSON.stringify({ ...raw, created_at: "yesterday", started_at: 12, finished_at: "not a time" }),
    );
    expect("created_at" in decoded).toBe(false);
    expect("started_at" in decoded).toBe(false);
    expect("finished_at" in decoded).toBe(false);
  });

  it("keeps an exit code of null (it can never be known) apart from one not known yet", () => {
    expect(decodeTaskState(encodeTaskState(makeTask({ exitCode: null }), BOOT_ID)).exit_code).toBeNull();
    expect(decodeTaskState(encodeTaskState(makeTask({ exitCode: 0 }), BOOT_ID)).exit_code).toBe(0);
    // A running task's exit code is not known yet; after a restart it must still be "not yet
    // known" (undefined), or the reconciler never records the real one (docs/fault-matrix.md A12).
    expect(decodeTaskState(encodeTaskState(makeTask(), BOOT_ID)).exit_code).toBeUndefined();
  });

  it.each(["pending", "preparing", "pulling", "creating", "running", "terminated"] as const)(
    "keeps the status %s",
    (status) => {
      expect(decodeTaskState(encodeTaskState(makeTask({ status }), BOOT_ID)).status).toBe(status);
    },
  );
});

describe("reading dstack-shim's v1 format", () => {
  it("reads a file without taskshim's extra fields", async () => {
    await writeFile(join(dir, TASK_STATE_FILE), DSTACK_SHIM_V1);
    const state = readTaskState(dir);
    expect(state.version).toBe(1);
    expect(state.id).toBe(ID);
    expect(state.termination_reason).toBe("");
    expect(state.termination_message).toBe("");
    expect(state.cleaned_up).toBe(false);
    expect(state).not.toHaveProperty("status");
    expect(state).not.toHaveProperty("exit_code");
    expect(state).not.toHaveProperty("boot_id");
    expect(state.config).toMatchObject({
      id: ID,
      name: "vllm-0-0",
      image_name: "dstackai/base:py3.12-0.7-cuda-12.1",
      gpu: -1,
      network_mode: "host",
      volumes: [],
      volume_mounts: [{ name: "data", path: "/data" }],
      instance_mounts: [],
      gpu_devices: [],
      host_ssh_user: "ubuntu",
    });
  });

  it("reads a terminated dstack-shim task and lower-cases its reason", () => {
    const text = DSTACK_SHIM_V1.replace(
      `"termination_reason":"","termination_message":"","cleaned_up":false`,
      `"termination_reason":"TERMINATED_BY_USER","termination_message":"bye","cleaned_up":true`,
    );
    expect(decodeTaskState(text)).toMatchObject({
      termination_reason: "terminated_by_user",
      termination_message: "bye",
      cleaned_up: true,
    });
  });

  it("ignores fields it does not know", () => {
    const text = DSTACK_SHIM_V1.replace(`"cleaned_up":false`, `"cleaned_up":false,"future_field":{"x":1}`);
    expect(decodeTaskState(text).id).toBe(ID);
  });
});

describe("rejected task.json", () => {
  it("refuses another version with UnsupportedTaskStateVersionError", () => {
    const text = DSTACK_SHIM_V1.replace(`"version":1`, `"version":2`);
    expect(() => decodeTaskState(text)).toThrow(UnsupportedTaskStateVersionError);
    expect(() => decodeTaskState(text)).toThrow("unsupported task state version 2");
    try {
      decodeTaskState(text);
    } catch (error) {
      expect((error as UnsupportedTaskStateVersionError).version).toBe(2);
    }
  });

  it("S16 reads what it can of a newer version's file to show it, field by field", () => {
    const newer = (fields: Record<string, unknown>): UnsupportedTaskStateVersionError => {
      try {
        decodeTaskState(JSON.stringify({ version: 2, ...fields }));
      } catch (error) {
        return error as UnsupportedTaskStateVersionError;
      }
      throw new Error("decoded");
    };
    expect(
      newer({
        id: ID,
        config: { name: "vllm-0-0", image_name: "img:1", gpu: "a newer shape" },
        status: "queued",
        termination_reason: "Preempted",
        termination_message: "m",
        exit_code: null,
        created_at: "2027-01-01T00:00:00.000Z",
        started_at: "later",
      }).view,
    ).toEqual({
      version: 2,
      id: ID,
      name: "vllm-0-0",
      image_name: "img:1",
      status: "queued",
      termination_reason: "preempted",
      termination_message: "m",
      exit_code: null,
      created_at: "2027-01-01T00:00:00.000Z",
    });
    // Only what is safe to show: a forged name or status is dropped, an invalid id leaves no view.
    expect(
      newer({ id: ID, config: { name: "a/b" }, status: "Not A Word", termination_reason: 5 }).view,
    ).toEqual({
      version: 2,
      id: ID,
      termination_reason: "",
      termination_message: "",
    });
    expect(newer({ id: "x".repeat(300) }).view).toBeUndefined();
    expect(newer({}).view).toBeUndefined();
  });

  it.each([
    ["empty", ""],
    ["truncated mid-object", DSTACK_SHIM_V1.slice(0, Math.floor(DSTACK_SHIM_V1.length / 2))],
    ["cut before the last brace", DSTACK_SHIM_V1.trimEnd().slice(0, -1)],
    ["garbage", "\u0000\u0000\u0000\u0000"],
    ["binary noise", "\u00ff\u00fe{]"],
    ["an array", "[]"],
    ["null", "null"],
    ["a number", "1"],
  ])("reports %s as CorruptTaskStateError", (_what, text) => {
    expect(() => decodeTaskState(text)).toThrow(CorruptTaskStateError);
  });

  it.each([
    ["no id", (t: string) => t.replace(`"id":"${ID}","config"`, `"config"`)],
    [
      "an id that does not match the config",
      (t: string) => t.replace(`"id":"${ID}","config"`, `"id":"other","config"`),
    ],
    ["a config without image_name", (t: string) => t.replace(/"image_name":"[^"]*",/, "")],
    [
      "a config that is not an object",
      (t: string) => t.replace(/"config":\{.*\},"termination_reason"/, `"config":[],"termination_reason"`),
    ],
    ["a numeric name", (t: string) => t.replace(`"name":"vllm-0-0"`, `"name":7`)],
    ["a textual gpu count", (t: string) => t.replace(`"gpu":-1`, `"gpu":"all"`)],
    [
      "a key list holding a number",
      (t: string) => t.replace(`"container_ssh_keys":[`, `"container_ssh_keys":[1,`),
    ],
    [
      "a volume mount that is not an object",
      (t: string) =>
        t.replace(`"volume_mounts":[{"name":"data","path":"/data"}]`, `"volume_mounts":["data"]`),
    ],
    [
      "a reason that is not a word",
      (t: string) => t.replace(`"termination_reason":""`, `"termination_reason":"no pe!"`),
    ],
    ["a numeric status", (t: string) => t.replace(`"cleaned_up":false`, `"cleaned_up":false,"status":3`)],
    [
      "a status that is not a word",
      (t: string) => t.replace(`"cleaned_up":false`, `"cleaned_up":false,"status":"Run ning"`),
    ],
    // S11: a forged id or name becomes a label, a URL segment and a dir name: never loaded.
    ["a forged id of 300 characters", (t: string) => t.replaceAll(ID, "a".repeat(300))],
    ["a forged id with a slash", (t: string) => t.replaceAll(ID, "../../etc")],
    ["a forged id with a control character", (t: string) => t.replaceAll(ID, "id\\u0007bell")],
    ["a forged name with a slash", (t: string) => t.replace(`"name":"vllm-0-0"`, `"name":"a/../b"`)],
    [
      "a forged name of 300 characters",
      (t: string) => t.replace(`"name":"vllm-0-0"`, `"name":"${"n".repeat(300)}"`),
    ],
    ["a forged name with a newline", (t: string) => t.replace(`"name":"vllm-0-0"`, `"name":"a\\nb"`)],
    [
      "a fractional exit code",
      (t: string) => t.replace(`"cleaned_up":false`, `"cleaned_up":false,"exit_code":1.5`),
    ],
  ])("reports a file with %s as CorruptTaskStateError", (_what, edit) => {
    const text = edit(DSTACK_SHIM_V1);
    expect(text).not.toBe(DSTACK_SHIM_V1);
    expect(() => decodeTaskState(text)).toThrow(CorruptTaskStateError);
  });

  it("S11 names a forged id in the error, escaped and cut, never whole", () => {
    const forged = `x\u0001${"a".repeat(298)}`;
    const text = DSTACK_SHIM_V1.replaceAll(ID, "ID").replaceAll(`"ID"`, JSON.stringify(forged));
    const error = (() => {
      try {
        return decodeTaskState(text);
      } catch (e) {
        return e;
      }
    })();
    expect(error).toBeInstanceOf(CorruptTaskStateError);
    expect((error as Error).message).toMatch(
      /^task state has an invalid id "x\\u0001a+" \(300 characters\)$/,
    );
    expect((error as Error).message.length).toBeLessThan(120);
  });

  it("S10 refuses a task.json beyond 1 MiB on disk unread, and writes none that large", async () => {
    const big = DSTACK_SHIM_V1.replace(
      `"cleaned_up":false`,
      `"cleaned_up":false,"padding":"${"x".repeat(TASK_STATE_MAX_BYTES)}"`,
    );
    await writeFile(join(dir, TASK_STATE_FILE), big);
    expect(() => readTaskState(dir)).toThrow(FileTooLargeError);
    const huge = makeTask({ terminationMessage: "m".repeat(TASK_STATE_MAX_BYTES) });
    await expect(writeTaskState(dir, huge, BOOT_ID)).rejects.toThrow(TaskStateTooLargeError);
    expect(await readFile(join(dir, TASK_STATE_FILE), "utf8")).toBe(big);
    expect(encodedTaskStateBytes(makeTask(), BOOT_ID)).toBe(
      Buffer.byteLength(encodeTaskState(makeTask(), BOOT_ID)),
    );
  });

  it("S9 refuses a task.json that is a FIFO or a symlink, without waiting or following", async () => {
    execFileSync("mkfifo", [join(dir, TASK_STATE_FILE)]);
    expect(thrownBy(() => readTaskState(dir))).toMatchObject({ name: "NotRegularFileError", kind: "a FIFO" });
    await rm(join(dir, TASK_STATE_FILE));
    await symlink("/dev/zero", join(dir, TASK_STATE_FILE));
    expect(thrownBy(() => readTaskState(dir))).toMatchObject({
      name: "NotRegularFileError",
      kind: "a symbolic link",
    });
  });

  it("reports a truncated file on disk as CorruptTaskStateError and a missing one as ENOENT", async () => {
    await writeFile(join(dir, TASK_STATE_FILE), "");
    expect(() => readTaskState(dir)).toThrow(CorruptTaskStateError);
    await rm(join(dir, TASK_STATE_FILE));
    expect(thrownBy(() => readTaskState(dir))).toMatchObject({ code: "ENOENT" });
  });
});

describe("rejected task.json: what the error says", () => {
  const withField = (field: string, value: string) =>
    DSTACK_SHIM_V1.replace(`"cleaned_up":false`, `"cleaned_up":false,"${field}":${value}`);
  it.each([
    ["not JSON", "{", "task state is not valid JSON"],
    ["an array", "[]", "task state is not a JSON object"],
    ["null", "null", "task state is not a JSON object"],
    ["a number", "1", "task state is not a JSON object"],
    ["a string", '"task"', "task state is not a JSON object"],
    [
      "version 0",
      DSTACK_SHIM_V1.replace(`"version":1`, `"version":0`),
      "task state has an invalid version 0",
    ],
    [
      "version 1.5",
      DSTACK_SHIM_V1.replace(`"version":1`, `"version":1.5`),
      "task state has an invalid version 1.5",
    ],
    [
      "version as text",
      DSTACK_SHIM_V1.replace(`"version":1`, `"version":"1"`),
      'task state has an invalid version "1"',
    ],
    ["no version", DSTACK_SHIM_V1.replace(`"version":1,`, ""), "task state has an invalid version undefined"],
    [
      "an empty id",
      DSTACK_SHIM_V1.replace(`"id":"${ID}","config"`, `"id":"","config"`),
      "task state has no id",
    ],
    [
      "a numeric id",
      DSTACK_SHIM_V1.replace(`"id":"${ID}","config"`, `"id":5,"config"`),
      "task state has no id",
    ],
    [
      "an id that is not its config's",
      DSTACK_SHIM_V1.replace(`"id":"${ID}","config"`, `"id":"other","config"`),
      "task state id does not match its config",
    ],
    [
      "a config without image_name",
      DSTACK_SHIM_V1.replace(/"image_name":"[^"]*",/, ""),
      "task state has an invalid config: config has no image_name",
    ],
    [
      "a textual memory",
      DSTACK_SHIM_V1.replace(`"memory":0`, `"memory":"16G"`),
      "task state has an invalid config: memory has the wrong type",
    ],
    [
      "a volume whose init_fs is text",
      DSTACK_SHIM_V1.replace(`"volumes":null`, `"volumes":[{"name":"v","init_fs":"yes"}]`),
      "task state has an invalid config: volumes[0].init_fs has the wrong type",
    ],
    [
      "a numeric reason",
      DSTACK_SHIM_V1.replace(`"termination_reason":""`, `"termination_reason":3`),
      "task state has an invalid termination_reason",
    ],
    ["a numeric status", withField("status", "3"), "task state has an invalid status"],
    ["a textual exit code", withField("exit_code", '"0"'), "task state has an invalid exit_code"],
  ])("%s: CorruptTaskStateError with its reason", (_what, text, message) => {
    let error: unknown;
    try {
      decodeTaskState(text);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(CorruptTaskStateError);
    expect((error as Error).name).toBe("CorruptTaskStateError");
    expect((error as Error).message).toBe(message);
  });

  it("keeps the parser's error as the cause", () => {
    const notJson = (() => {
      try {
        return decodeTaskState("{");
      } catch (error) {
        return error as Error;
      }
    })() as Error;
    expect(notJson.cause).toBeInstanceOf(SyntaxError);
    const badConfig = (() => {
      try {
        return decodeTaskState(DSTACK_SHIM_V1.replace(/"image_name":"[^"]*",/, ""));
      } catch (error) {
        return error as Error;
      }
    })() as Error;
    expect((badConfig.cause as Error).message).toBe("config has no image_name");
    expect((badConfig.cause as Error).name).toBe("StoredConfigError");
  });

  it("names the newer-format error", () => {
    const error = new UnsupportedTaskStateVersionError(9);
    expect([error.name, error.version]).toEqual(["UnsupportedTaskStateVersionError", 9]);
  });

  it("reads a missing reason and a non-text message as empty", () => {
    const text = DSTACK_SHIM_V1.replace(`"termination_reason":"",`, "").replace(
      `"termination_message":""`,
      `"termination_message":42`,
    );
    const state = decodeTaskState(text);
    expect([state.termination_reason, state.termination_message]).toEqual(["", ""]);
  });
});

describe("task.json as a contract between releases", () => {
  it("reads a config that today's submit rules refuse: the file is a record, not a request", () => {
    const stored = JSON.parse(DSTACK_SHIM_V1) as { config: Record<string, unknown> };
    stored.config.env = { "not-a-shell-name": "1" };
    stored.config.volume_mounts = [{ name: "data", path: "relative/path" }];
    stored.config.gpu = 100_000;
    expect(() => parseTaskConfig(stored.config)).toThrow();
    const state = decodeTaskState(JSON.stringify(stored));
    expect(state.config).toMatchObject({
      env: { "not-a-shell-name": "1" },
      volume_mounts: [{ name: "data", path: "relative/path" }],
      gpu: 100_000,
    });
  });

  it("reads what it writes, for every config the submit accepts", () => {
    const task = makeTask({ status: "terminated", terminationReason: "done_by_runner", exitCode: 0 });
    const state = decodeTaskState(encodeTaskState(task, BOOT_ID));
    expect(state.config).toEqual(CONFIG);
    expect(state).not.toHaveProperty("unknown_fields");
  });

  it("reads a reason and a status a newer release may write: the reason as written, the status kept as unknown", () => {
    const text = DSTACK_SHIM_V1.replace(
      `"termination_reason":"","termination_message":"","cleaned_up":false`,
      `"termination_reason":"evicted_by_scheduler","termination_message":"m","cleaned_up":false,"status":"stopping"`,
    );
    const state = decodeTaskState(text);
    expect(state.termination_reason).toBe("evicted_by_scheduler");
    expect(state).not.toHaveProperty("status");
    expect(state.unknown_status).toBe("stopping");
    expect(decodeTaskState(DSTACK_SHIM_V1)).not.toHaveProperty("unknown_status");
  });

  it("keeps a newer release's fields, at the top, in the config and in a volume, and writes them back unchanged", () => {
    const newer = JSON.parse(encodeTaskState(makeTask({ status: "running" }), BOOT_ID)) as Record<
      string,
      unknown
    >;
    const config = newer.config as Record<string, unknown>;
    newer.preempted_at = "2027-01-01T00:00:00.000Z";
    newer.placement = { zone: "b", attempts: [1, 2] };
    config.user_data = "#cloud-config";
    config.volumes = [{ ...(config.volumes as object[])[0], throughput: 125 }];
    const state = decodeTaskState(JSON.stringify(newer));
    expect(state.unknown_fields).toEqual({
      file: { preempted_at: "2027-01-01T00:00:00.000Z", placement: { zone: "b", attempts: [1, 2] } },
      config: { user_data: "#cloud-config" },
    });
    // This version rewrites the task (a status change), as a restore and a reconcile would.
    const rewritten = encodeTaskState(
      makeTask({
        config: state.config,
        status: "terminated",
        terminationReason: "done_by_runner",
        ...(state.unknown_fields ? { unknownFields: state.unknown_fields } : {}),
      }),
      BOOT_ID,
    );
    const raw = JSON.parse(rewritten) as Record<string, unknown>;
    expect(raw).toMatchObject({
      preempted_at: "2027-01-01T00:00:00.000Z",
      placement: { zone: "b", attempts: [1, 2] },
      status: "terminated",
      termination_reason: "done_by_runner",
    });
    expect(raw.config).toMatchObject({
      user_data: "#cloud-config",
      volumes: [expect.objectContaining({ name: "data", throughput: 125 })],
    });
  });

  it("never lets a kept field shadow one this version writes", () => {
    const state = decodeTaskState(DSTACK_SHIM_V1);
    const raw = JSON.parse(
      encodeTaskState(
        makeTask({
          config: state.config,
          unknownFields: { file: { status: "pending", extra: 1 }, config: { image_name: "evil" } },
        }),
        BOOT_ID,
      ),
    ) as { status: string; config: { image_name: string } };
    expect([raw.status, raw.config.image_name]).toEqual(["running", state.config.image_name]);
  });
});
