import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import type { InjectOptions } from "fastify";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { InstanceMountPoint } from "../host/volumes.js";
import { HostVolumes } from "../host/volumes.js";
import { FakeCommandRunner } from "../testing/fake-command-runner.js";
import { sshEd25519PublicKey } from "../testing/fixtures.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import type { Task } from "../tasks/task.js";
import { TERMINATION_REASONS } from "../tasks/termination-reason.js";
import type { buildApi } from "./server.js";
import { buildTestApi } from "../testing/test-api.js";

/*
 * Property-based fuzzing of the whole HTTP edge down to the runner, with a fake engine. Tasks
 * are seeded first; then mostly valid-by-construction submits (arbitrary names, env, mounts,
 * keys within the rules), the same bodies with one hostile field, terminate / logs / remove /
 * get on existing ids, containers exiting on their own, and random malicious requests. Never a
 * 5xx, never a crash, nothing written outside the shim's home, and a rejected request changes
 * nothing: statuses, reasons, exit codes, GPU locks, authorized_keys, mounts, containers and
 * task dirs are compared before and after it. The run counts how many requests reached each
 * route's handler and how many tasks were created, and asserts both are substantial.
 */

const RUNS = Number(process.env.FUZZ_RUNS ?? 2_000);
/** tmpfs where there is one: hundreds of task dirs are fsynced, and the disk is shared. */
const SCRATCH = existsSync("/dev/shm") ? "/dev/shm" : tmpdir();

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

/** Host users the valid submits use; their authorized_keys are part of every snapshot. */
const USERS = ["ubuntu", "deploy"] as const;
/** A pool of real keys (generating one per body would dominate the run time). */
const KEYS = Array.from({ length: 4 }, (_, i) => sshEd25519PublicKey(`fuzz-${i}@host`));
const pathSegment = fc
  .stringMatching(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,11}$/)
  .filter((s) => s !== "." && !s.includes(".."));
const absPath = fc.array(pathSegment, { minLength: 1, maxLength: 3 }).map((parts) => `/${parts.join("/")}`);

/** Valid by construction: every field within parseTaskConfig's rules, so it reaches the runner. */
const validSubmit = fc.record(
  {
    id: fc.oneof(fc.uuid(), fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}$/)),
    name: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$/),
    image_name: fc.constantFrom(
      "busybox:1",
      "registry.local:5000/team/app:v2",
      "ubuntu@sha256:" + "b".repeat(64),
    ),
    gpu: fc.integer({ min: -1, max: 2 }),
    cpu: fc.double({ min: 0, max: 8, noNaN: true }),
    memory: fc.integer({ min: 0, max: 2 ** 34 }),
    shm_size: fc.integer({ min: 0, max: 2 ** 30 }),
    network_mode: fc.constantFrom("host", "bridge", ""),
    instance_mounts: fc.array(fc.record({ instance_path: absPath, path: absPath }), { maxLength: 2 }),
    host_ssh_user: fc.constantFrom(...USERS, ""),
    host_ssh_keys: fc.subarray(KEYS, { maxLength: 2 }),
    container_ssh_keys: fc.subarray(KEYS, { maxLength: 2 }),
    command: fc.array(
      fc.string({ maxLength: 12 }).filter((a) => !a.includes("\u0000")),
      {
        minLength: 1,
        maxLength: 3,
      },
    ),
    env: fc.dictionary(fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,15}$/), fc.string({ maxLength: 12 }), {
      maxKeys: 3,
    }),
  },
  { requiredKeys: ["id", "name", "image_name"] },
);

/** A valid body with one field made hostile: it must be rejected whole, or accepted harmlessly. */
const spoiledSubmit = fc
  .tuple(
    validSubmit,
    fc.constantFrom(
      "id",
      "name",
      "image_name",
      "gpu",
      "cpu",
      "memory",
      "network_mode",
      "instance_mounts",
      "volume_mounts",
      "host_ssh_user",
      "host_ssh_keys",
      "env",
      "command",
    ),
    fc.oneof(
      anyValue,
      idLike,
      fc.array(fc.record({ instance_path: idLike, path: idLike, name: idLike }), { maxLength: 2 }),
    ),
  )
  .map(([valid, field, value]) => ({ ...valid, [field]: value }));

const terminateBody = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .record(
        {
          termination_reason: fc.constantFrom(
            ...TERMINATION_REASONS,
            ...TERMINATION_REASONS.map((r) => r.toUpperCase()),
          ),
          termination_message: fc.string({ maxLength: 20 }),
          timeout: fc.integer({ min: 0, max: 3 }),
        },
        { requiredKeys: [] },
      )
      .map((b) => JSON.stringify(b)),
  },
  { weight: 1, arbitrary: body.map((b) => b ?? "") },
);
const tail = fc.oneof(fc.integer({ min: 1, max: 200 }).map(String), idLike.map(encodeURIComponent));

/** One step: a request, or the engine changing something on its own. `pick` chooses an existing task. */
type Step =
  | { readonly kind: "submit"; readonly body: Record<string, unknown>; readonly reuseId: number | undefined }
  | { readonly kind: "terminate"; readonly pick: number; readonly body: string }
  | { readonly kind: "logs" | "remove" | "get"; readonly pick: number; readonly tail: string }
  | { readonly kind: "exit"; readonly pick: number; readonly code: number }
  | {
      readonly kind: "raw";
      readonly method: string;
      readonly url: string;
      readonly contentType: string | undefined;
      readonly body: string | undefined;
    };

const pick = fc.nat();
const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant("submit" as const),
      body: validSubmit,
      // Now and then the id of an existing task: same config is idempotent, another is a 409.
      reuseId: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: pick }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("submit" as const),
      body: spoiledSubmit,
      reuseId: fc.constant(undefined),
    }),
  },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("terminate" as const), pick, body: terminateBody }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("logs" as const), pick, tail }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("remove" as const), pick, tail }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("get" as const), pick, tail }) },
  {
    weight: 1,
    arbitrary: fc.record({
      kind: fc.constant("exit" as const),
      pick,
      code: fc.integer({ min: 0, max: 255 }),
    }),
  },
  { weight: 4, arbitrary: request.map((r) => ({ kind: "raw" as const, ...r })) },
);

/** Everything a rejected request must leave as it was. */
interface Snapshot {
  /** The store's frozen task objects: any change to a task replaces its object. */
  readonly tasks: ReadonlyMap<string, Task>;
  readonly text: string;
}

async function snapshot(): Promise<Snapshot> {
  const tasks = new Map(env.ctx.store.list().map((t) => [t.id, t]));
  const keys = await Promise.all(
    USERS.map((u) => readFile(join(env.userHome(u), ".ssh", "authorized_keys"), "utf8").catch(() => "")),
  );
  const hostCommands = env.commands.calls.filter((c) =>
    /^(mount|umount|mkfs|mkdir|chmod)/.test(c.argv[0] ?? ""),
  );
  const containers = [...env.docker.containers.values()].map(
    (c) => `${c.id.slice(-6)}:${c.state}:${c.exitCode}`,
  );
  const text = JSON.stringify({
    gpus: env.ctx.gpuLock.lockedIds(),
    keys,
    mounts: [
      (env.ctx.volumes as RecordingVolumes).instanceMounts.length,
      hostCommands.length,
      [...env.commands.mounted],
    ],
    containers,
    dirs: (await readdir(join(home, "runners")).catch(() => [] as string[])).sort(),
  });
  return { tasks, text };
}

/** The fields of a task a rejected request must not change, for a readable failure. */
const taskLine = (t: Task | undefined): string =>
  t === undefined
    ? "absent"
    : JSON.stringify([
        t.status,
        t.terminationReason,
        t.exitCode,
        t.cleanedUp,
        t.gpuIds,
        (t.containerId ?? "").slice(-6),
        t.config.name,
      ]);

function expectUnchanged(before: Snapshot, after: Snapshot, what: string): void {
  for (const id of new Set([...before.tasks.keys(), ...after.tasks.keys()])) {
    const [b, a] = [before.tasks.get(id), after.tasks.get(id)];
    if (b !== a) expect(`${id}: ${taskLine(a)}`, what).toBe(`${id}: ${taskLine(b)}`);
  }
  expect(after.text, what).toBe(before.text);
}

/** How many requests reached each route's handler (past routing and schema validation). */
const handled = new Map<string, number>();
/** How many calls reached the runner, by method, and how many of them succeeded. */
const reachedRunner = { submit: 0, terminate: 0, remove: 0 };
const succeeded = { submit: 0, terminate: 0, remove: 0 };

beforeAll(async () => {
  parent = await mkdtemp(join(SCRATCH, "taskshim-fuzz-"));
  home = join(parent, "home");
  await mkdir(home);
  const commands = new FakeCommandRunner();
  env = await makeContext({
    home,
    commands,
    volumes: new RecordingVolumes(commands, { mountRoot: join(home, "volumes") }),
  });
  app = buildTestApi(env, { commands });
  app.addHook("preHandler", (request, _reply, done) => {
    const route = `${request.method} ${request.routeOptions.url ?? "(none)"}`;
    handled.set(route, (handled.get(route) ?? 0) + 1);
    done();
  });
  const counted =
    <A extends unknown[], R>(method: keyof typeof reachedRunner, original: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      reachedRunner[method]++;
      const result = await original(...args);
      succeeded[method]++;
      return result;
    };
  // Bound before spying: the spy replaces the method the originals would otherwise reach.
  const { submit, terminate, remove } = {
    submit: env.runner.submit.bind(env.runner),
    terminate: env.runner.terminate.bind(env.runner),
    remove: env.runner.remove.bind(env.runner),
  };
  vi.spyOn(env.runner, "submit").mockImplementation(counted("submit", submit));
  vi.spyOn(env.runner, "terminate").mockImplementation(counted("terminate", terminate));
  vi.spyOn(env.runner, "remove").mockImplementation(counted("remove", remove));
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  await env?.runner.awaitStarts();
  await rm(parent, { recursive: true, force: true });
});

/** Seeds tasks in several statuses through the API, so the run starts with ids to aim at. */
async function seed(): Promise<void> {
  const submits = [
    {
      id: "seed-running",
      name: "seed",
      image_name: "busybox:1",
      host_ssh_user: "ubuntu",
      host_ssh_keys: [KEYS[0]],
    },
    { id: "seed-gpu", name: "seed-gpu", image_name: "busybox:1", gpu: 1 },
    {
      id: "seed-mounts",
      name: "seed-mounts",
      image_name: "busybox:1",
      instance_mounts: [{ instance_path: "/data/a", path: "/a" }],
    },
    {
      id: "seed-exited",
      name: "seed-exited",
      image_name: "busybox:1",
      host_ssh_user: "deploy",
      host_ssh_keys: [KEYS[1]],
    },
    { id: "seed-terminated", name: "seed-terminated", image_name: "busybox:1" },
  ];
  for (const payload of submits) {
    const res = await app.inject({ method: "POST", url: "/api/tasks", payload });
    expect(res.statusCode, res.body).toBe(200);
  }
  await env.runner.awaitStarts();
  env.docker.exit(env.ctx.store.mustGet("seed-exited").containerId!, 3);
  await env.reconciler.tick();
  const res = await app.inject({ method: "POST", url: "/api/tasks/seed-terminated/terminate", payload: {} });
  expect(res.statusCode, res.body).toBe(200);
  expect(env.ctx.store.list().map((t) => t.status)).toEqual([
    "running",
    "running",
    "running",
    "terminated",
    "terminated",
  ]);
}

const ID_RULE = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;
let fresh = 0;

/** The request a step makes, against the tasks that exist now. */
function requestOf(s: Step): InjectOptions | undefined {
  const ids = env.ctx.store.list().map((t) => t.id);
  const chosen = (n: number) => encodeURIComponent(ids[n % ids.length] ?? "none");
  const json = { "content-type": "application/json" };
  switch (s.kind) {
    case "submit": {
      const existing = s.reuseId === undefined ? undefined : env.ctx.store.list()[s.reuseId % ids.length];
      // Reusing an id: half the time with its exact config (idempotent), else with this body (409).
      // A fresh id gets a counter suffix: fast-check's bias repeats small ids, which would make
      // most "new" submits resubmits.
      const payload =
        existing === undefined
          ? typeof s.body.id === "string" && ID_RULE.test(`${s.body.id}.${fresh}`)
            ? { ...s.body, id: `${s.body.id}.${fresh++}` }
            : s.body
          : s.reuseId! % 2 === 0
            ? { ...existing.config }
            : { ...s.body, id: existing.id };
      return { method: "POST", url: "/api/tasks", headers: json, payload: JSON.stringify(payload) };
    }
    case "terminate":
      return {
        method: "POST",
        url: `/api/tasks/${chosen(s.pick)}/terminate`,
        headers: json,
        payload: s.body,
      };
    case "logs":
      return { method: "GET", url: `/api/tasks/${chosen(s.pick)}/logs?tail=${s.tail}` };
    case "remove":
      return { method: "POST", url: `/api/tasks/${chosen(s.pick)}/remove` };
    case "get":
      return { method: "GET", url: `/api/tasks/${chosen(s.pick)}` };
    case "exit":
      return undefined;
    case "raw":
      return {
        method: s.method,
        url: s.url,
        headers: s.contentType === undefined ? {} : { "content-type": s.contentType },
        ...(s.body === undefined ? {} : { payload: s.body }),
      };
  }
}

describe("hostile input", () => {
  it(`reaches the runner, never answers 5xx, never escapes the home, and changes nothing when it rejects (${RUNS} steps)`, async () => {
    await seed();
    const seeded = env.ctx.store.list().length;
    let requests = 0;
    let rejected = 0;
    const statuses = new Map<number, number>();
    const created = new Set<string>();
    await fc.assert(
      fc.asyncProperty(step, async (s) => {
        if (s.kind === "exit") {
          // The workload ends on its own; the reconciler finalizes it.
          const running = env.ctx.store
            .list()
            .filter((t) => t.status === "running" && t.containerId !== undefined);
          const task = running[s.pick % Math.max(1, running.length)];
          if (task?.containerId && env.docker.find(task.containerId))
            env.docker.exit(task.containerId, s.code);
          await env.reconciler.tick();
          return;
        }
        const options = requestOf(s);
        if (options === undefined) return;
        const before = await snapshot();
        const res = await app.inject(options);
        // Starts run in the background: let them finish, so the next snapshot is stable.
        await env.runner.awaitStarts();
        requests += 1;
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        const what = `${JSON.stringify([options.method, options.url, options.payload]).slice(0, 400)} → ${res.statusCode} ${res.body.slice(0, 300)}`;
        expect(res.statusCode, what).toBeLessThan(500);
        if (res.statusCode >= 400) {
          rejected += 1;
          expectUnchanged(before, await snapshot(), what);
        } else if (s.kind === "submit") {
          const id = (JSON.parse(res.body) as { id: string }).id;
          if (!before.tasks.has(id)) created.add(id);
        }
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
    const handledBy = Object.fromEntries([...handled].sort());
    console.log(
      `fuzz: ${requests} requests (${rejected} rejected), ${seeded} seeded, ${created.size} tasks created, ` +
        `${env.ctx.store.list().length} left; reached the runner ${JSON.stringify(reachedRunner)}, ` +
        `succeeded ${JSON.stringify(succeeded)}; handlers ${JSON.stringify(handledBy)}; ` +
        `statuses ${JSON.stringify(Object.fromEntries(statuses))}`,
    );
    // The run must exercise the runner, not just the validation in front of it.
    const substantial = Math.floor(RUNS / 25);
    expect(created.size).toBeGreaterThanOrEqual(substantial * 2);
    expect(succeeded.submit).toBeGreaterThanOrEqual(substantial * 2);
    expect(succeeded.terminate).toBeGreaterThanOrEqual(substantial);
    expect(succeeded.remove).toBeGreaterThanOrEqual(substantial / 2);
    expect(handled.get("GET /api/tasks/:id/logs") ?? 0).toBeGreaterThanOrEqual(substantial);
    expect(requests).toBeGreaterThanOrEqual(RUNS / 2);
  }, 240_000);
});
