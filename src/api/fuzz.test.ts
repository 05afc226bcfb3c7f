import { mkdir, mkdtemp, readdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import type { InjectOptions } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { InstanceMountPoint } from "../host/volumes.js";
import { HostVolumes } from "../host/volumes.js";
import { FakeCommandRunner, makeContext, sshEd25519PublicKey, type TestEnv } from "../runner/test-support.js";
import type { buildApi } from "./server.js";
import { buildTestApi } from "./test-api.js";

/*
 * Property-based fuzzing of the whole HTTP edge with a fake engine: random and malicious
 * methods, paths, headers and bodies. Never a 5xx, never a crash, nothing written outside the
 * shim's home, and a rejected request changes nothing.
 */

const RUNS = Number(process.env.FUZZ_RUNS ?? 10_000);

/** Instance mounts would create host dirs anywhere: recorded here, never created. */
class RecordingVolumes extends HostVolumes {
  readonly instanceMounts: InstanceMountPoint[] = [];
  override prepareInstanceMounts(mounts: readonly InstanceMountPoint[]): Promise<void> {
    this.instanceMounts.push(...mounts);
    return Promise.resolve();
  }
}

let env: TestEnv;
let parent: string;
let home: string;
let app: ReturnType<typeof buildApi>;

const hostile = fc.constantFrom(
  "..",
  "../..",
  "../../etc/passwd",
  "/etc/passwd",
  "a/b",
  "a\u0000b",
  "%2e%2e",
  "%2e%2e%2f%2e%2e",
  "..%2f..",
  "\u202e\u0041",
  "ｆｕｌｌ",
  "x".repeat(5000),
  "",
  " ",
  "tst-ok",
  "$(reboot)",
  "`id`",
  "a;b",
  "..\\..",
  "CON",
  ".hidden",
);
const idLike = fc.oneof(hostile, fc.string({ maxLength: 40 }), fc.uuid());
const encoded = idLike.map((s) => {
  try {
    return encodeURIComponent(s);
  } catch {
    return "x";
  }
});

const path = fc.oneof(
  fc.constantFrom(
    "/api/healthcheck",
    "/api/shutdown",
    "/api/instance/health",
    "/api/instance/info",
    "/api/components",
    "/api/components/install",
    "/api/tasks",
    "/metrics",
    "/api/openapi.json",
    "/",
    "/api",
    "//api//tasks",
    "/api/tasks/",
  ),
  encoded.map((id) => `/api/tasks/${id}`),
  encoded.map((id) => `/api/tasks/${id}/terminate`),
  encoded.map((id) => `/api/tasks/${id}/remove`),
  encoded.map((id) => `/api/tasks/${id}/logs?tail=${id}`),
  encoded.map((id) => `/metrics/tasks/${id}`),
  fc.webPath().map((p) => (p.startsWith("/") ? p : `/${p}`)),
);

const anyValue = fc.oneof(
  fc.string(),
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
  fc.constant(-1),
  fc.constant(2 ** 60),
  fc.constant(-(2 ** 31)),
  fc.array(fc.string(), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 8 }), { maxKeys: 3 }),
  hostile,
);

/** Mostly valid task configs with hostile values in random fields. */
const submitBody = fc
  .record(
    {
      id: fc.oneof(fc.uuid(), idLike),
      name: fc.oneof(fc.constant("tst-fuzz"), idLike),
      image_name: fc.oneof(
        fc.constantFrom("busybox:1", "127.0.0.1:5000/a/b@sha256:" + "a".repeat(64)),
        idLike,
      ),
      gpu: fc.oneof(fc.integer({ min: -3, max: 4 }), anyValue),
      cpu: fc.oneof(fc.double({ min: -1, max: 8, noNaN: true }), anyValue),
      memory: fc.oneof(fc.integer({ min: -1, max: 2 ** 40 }), anyValue),
      shm_size: anyValue,
      network_mode: fc.oneof(fc.constantFrom("host", "bridge", "none", "container:x"), anyValue),
      volumes: fc.array(
        fc.record({ name: idLike, backend: fc.constantFrom("aws", "gcp"), volume_id: idLike }),
        {
          maxLength: 2,
        },
      ),
      volume_mounts: fc.array(fc.record({ name: idLike, path: idLike }), { maxLength: 2 }),
      instance_mounts: fc.array(fc.record({ instance_path: idLike, path: idLike }), { maxLength: 2 }),
      host_ssh_user: fc.oneof(fc.constant("ubuntu"), idLike),
      host_ssh_keys: fc.array(fc.oneof(fc.constant(sshEd25519PublicKey()), idLike, anyValue), {
        maxLength: 2,
      }),
      container_ssh_keys: fc.array(
        fc.oneof(fc.constant(sshEd25519PublicKey()), fc.constant(`${sshEd25519PublicKey()}\nssh-rsa AAAA`)),
        { maxLength: 2 },
      ),
      command: fc.oneof(fc.array(fc.string(), { maxLength: 3 }), anyValue),
      env: fc.oneof(fc.dictionary(idLike, fc.string({ maxLength: 8 }), { maxKeys: 2 }), anyValue),
      registry_password: fc.string({ maxLength: 10 }),
    },
    { requiredKeys: [] },
  )
  .map((b) => JSON.stringify(b));

const body = fc.oneof(
  fc.constant(undefined),
  fc.constant(""),
  fc.constant("{"),
  fc.constant("null"),
  fc.constant("[]"),
  fc.constant('{"force":true}'.replace("true", '"yes"')),
  fc.json(),
  fc.string(),
  submitBody,
  fc
    .record(
      { termination_reason: anyValue, termination_message: anyValue, timeout: anyValue },
      { requiredKeys: [] },
    )
    .map((b) => JSON.stringify(b)),
  fc
    .record({ name: anyValue, url: anyValue, sha256: anyValue }, { requiredKeys: [] })
    .map((b) => JSON.stringify(b)),
);

const contentType = fc.oneof(
  { weight: 6, arbitrary: fc.constant("application/json") },
  fc.constant(undefined),
  fc.constantFrom("application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded"),
  fc.string({ maxLength: 20 }),
);

/** Random requests, and requests aimed at the routes that take bodies (where input matters most). */
const request = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      method: fc.constantFrom("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"),
      url: path,
      contentType,
      body,
    }),
  },
  {
    weight: 4,
    arbitrary: fc.record({
      method: fc.constant("POST"),
      url: fc.constant("/api/tasks"),
      contentType,
      body: submitBody,
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      method: fc.constant("POST"),
      url: encoded.map((id) => `/api/tasks/${id}/terminate`),
      contentType,
      body,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      method: fc.constant("POST"),
      url: fc.constant("/api/components/install"),
      contentType,
      body,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      method: fc.constant("GET"),
      url: path,
      contentType: fc.constant(undefined),
      body: fc.constant(undefined),
    }),
  },
);

/** What a rejected request must not change: the tasks' ids and configs, and the task dirs. */
async function snapshot(): Promise<string> {
  const tasks = env.ctx.store
    .list()
    .map((t) => ({ id: t.id, config: t.config }))
    .sort((a, b) => a.id.localeCompare(b.id));
  const dirs = (await readdir(join(home, "runners")).catch(() => [] as string[])).sort();
  return JSON.stringify({ tasks, dirs });
}

beforeAll(async () => {
  parent = await mkdtemp(join(tmpdir(), "taskshim-fuzz-"));
  home = join(parent, "home");
  await mkdir(home);
  const commands = new FakeCommandRunner();
  env = await makeContext({
    home,
    commands,
    volumes: new RecordingVolumes(commands, { mountRoot: join(home, "volumes") }),
  });
  app = buildTestApi(env, { commands });
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  await env?.runner.awaitStarts();
});

describe("hostile input", () => {
  it(`never answers 5xx, never escapes the home, and changes nothing when it rejects (${RUNS} requests)`, async () => {
    let count = 0;
    const statuses = new Map<number, number>();
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const before = await snapshot();
        const options = {
          method: r.method,
          url: r.url,
          headers: r.contentType === undefined ? {} : { "content-type": r.contentType },
          ...(r.body === undefined ? {} : { payload: r.body }),
        } as InjectOptions;
        const res = await app.inject(options);
        count += 1;
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        expect(res.statusCode, `${r.method} ${r.url} → ${res.statusCode} ${res.body}`).toBeLessThan(500);
        if (res.statusCode >= 400) expect(await snapshot()).toBe(before);
      }),
      { numRuns: RUNS },
    );
    // Nothing but the home was written next to it, and every task dir is a plain child of runners/.
    expect(await readdir(parent)).toEqual(["home"]);
    for (const dir of await readdir(join(home, "runners")).catch(() => [] as string[])) {
      expect(dir).toMatch(/^[A-Za-z0-9][A-Za-z0-9_.-]*-[0-9a-f]{8}$/);
    }
    for (const mount of (env.ctx.volumes as RecordingVolumes).instanceMounts) {
      expect(mount.instance_path.startsWith("/")).toBe(true);
      expect(mount.instance_path.split("/")).not.toContain("..");
    }
    expect(count).toBeGreaterThanOrEqual(RUNS);
    console.log(`fuzz: ${count} requests; statuses ${JSON.stringify(Object.fromEntries(statuses))}`);
  }, 240_000);
});
