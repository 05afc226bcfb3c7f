/* GET /api/components over the real HTTP edge: the taskshim extensions of an entry reach the wire. */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { exited, FakeCommandRunner } from "../testing/fake-command-runner.js";
import { makeContext, type TestEnv } from "../testing/test-context.js";
import { buildTestApi } from "../testing/test-api.js";
import type { buildApi } from "./server.js";

interface Entry {
  readonly name: string;
  readonly version: string;
  readonly status: string;
  readonly build_id?: string;
  readonly error?: string;
}

let env: TestEnv;
let app: ReturnType<typeof buildApi>;

beforeEach(async () => {
  env = await makeContext();
  // Every binary here is a taskshim 1.4.0 whose `version --json` has a build id.
  const commands = new FakeCommandRunner();
  commands.script = (argv) =>
    argv[1] === "--version"
      ? exited(0, "taskshim version 1.4.0\n")
      : exited(0, `${JSON.stringify({ version: "1.4.0", node: "26.12.1", build_id: "bid-7" })}\n`);
  app = buildTestApi(env, { commands });
  await app.ready();
});
afterEach(async () => {
  await app.close();
  await env.dispose();
});

async function shimEntry(): Promise<Entry> {
  const res = await app.inject({ method: "GET", url: "/api/components" });
  expect(res.statusCode).toBe(200);
  const found = res.json<{ components: Entry[] }>().components.find((c) => c.name === "dstack-shim");
  if (!found) throw new Error("no dstack-shim entry");
  return found;
}

async function install(url: string): Promise<void> {
  const res = await app.inject({
    method: "POST",
    url: "/api/components/install",
    headers: { "content-type": "application/json" },
    payload: JSON.stringify({ name: "dstack-shim", url }),
  });
  expect(res.statusCode).toBe(200);
}

/** The dstack-shim entry once its install has ended. */
async function settled(): Promise<Entry> {
  const deadline = Date.now() + 5_000;
  let entry = await shimEntry();
  while (entry.status === "installing") {
    if (Date.now() > deadline) throw new Error("the install did not end");
    await new Promise((resolve) => setTimeout(resolve, 20));
    entry = await shimEntry();
  }
  return entry;
}

interface EntrySchema {
  readonly properties: Record<string, unknown>;
  readonly required: readonly string[];
  readonly additionalProperties: false;
}

/**
 * The served OpenAPI schema of one component entry, closed (`additionalProperties: false`): an
 * answer that validates has no field the document does not describe.
 */
async function entrySchema(): Promise<EntrySchema> {
  const doc = (await app.inject({ method: "GET", url: "/api/openapi.json" })).json<{
    components: { schemas: Record<string, { properties: { components: { items: EntrySchema } } }> };
  }>();
  const items = doc.components.schemas.Components?.properties.components.items;
  if (!items) throw new Error("no Components schema in the document");
  return { ...items, additionalProperties: false };
}

describe("GET /api/components extensions", () => {
  it("the OpenAPI document describes build_id and error as optional fields of a component entry", async () => {
    const schema = await entrySchema();
    expect(Object.keys(schema.properties)).toEqual(expect.arrayContaining(["build_id", "error"]));
    expect(schema.required).not.toContain("build_id");
    expect(schema.required).not.toContain("error");
  });

  it("the dstack-shim entry carries build_id and a failed install's error on the wire, and the answer fits the document's closed entry schema", async () => {
    const source = join(env.home, "taskshim-1.4.0");
    await writeFile(source, "#!/bin/sh\n# a taskshim 1.4.0, as far as the fake runner is concerned\n");
    await install(`file://${source}`);
    expect(await settled()).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "bid-7",
    });

    await install("file:///dev/null");
    const failed = await settled();
    expect(failed).toEqual({
      name: "dstack-shim",
      version: "1.4.0",
      status: "installed",
      build_id: "bid-7",
      error: "/dev/null is not a regular file (a character device)",
    });
    const ajv = new Ajv2020({ strict: false });
    expect(ajv.validate(await entrySchema(), failed), ajv.errorsText()).toBe(true);
  });
});
