import { describe, expect, it } from "vitest";
import { parseTaskConfig } from "../tasks/task-config.js";
import { TASK_FIELDS } from "../tasks/task-fields.js";
import { decodeStoredConfig, KNOWN_CONFIG_KEYS, StoredConfigError } from "./stored-config.js";

/*
 * The stored-config reader and the submit parser are both derived from the table of fields
 * (tasks/task-fields.ts). These checks hold for every field of the table, a field added later
 * included, without naming it.
 */
const MINIMAL = { id: "task-1", name: "job-0-0", image_name: "debian" };
const FIELDS = Object.entries(TASK_FIELDS);

describe("the table of fields, read from task.json", () => {
  it("reads an absent or null field as the submit does: its zero value and default, or absent", () => {
    const submitted = parseTaskConfig(MINIMAL).config;
    expect(decodeStoredConfig(MINIMAL)).toEqual(submitted);
    const nulls = Object.fromEntries(FIELDS.map(([name]) => [name, null]));
    expect(decodeStoredConfig({ ...nulls, ...MINIMAL })).toEqual(submitted);
    expect(parseTaskConfig({ ...nulls, ...MINIMAL }).config).toEqual(submitted);
  });

  it("knows every field of the table, credentials included, and keeps none of them in the config", () => {
    expect([...KNOWN_CONFIG_KEYS]).toEqual(FIELDS.map(([name]) => name));
    const credentials = FIELDS.filter(([, field]) => "credential" in field).map(([name]) => name);
    expect(credentials).toEqual(["registry_username", "registry_password"]);
    const stored = decodeStoredConfig({ ...MINIMAL, registry_username: "u", registry_password: "p" });
    for (const name of credentials) expect(stored).not.toHaveProperty(name);
  });

  it.each(FIELDS.filter(([, field]) => "required" in field).map(([name]) => name))(
    "refuses a config without its required %s, as the submit does",
    (name) => {
      const config = { ...MINIMAL, [name]: "" };
      expect(() => decodeStoredConfig(config)).toThrow(new StoredConfigError(`config has no ${name}`));
      expect(() => parseTaskConfig(config)).toThrow(`empty ${name}`);
    },
  );

  it.each(FIELDS.filter(([, field]) => !("credential" in field)))(
    "refuses a %s of the wrong JSON type, as the submit does",
    (name, field) => {
      // No field but a boolean one takes `true`.
      const config = {
        ...MINIMAL,
        [name]: (field.schema as { type?: string }).type === "boolean" ? "yes" : true,
      };
      expect(() => decodeStoredConfig(config)).toThrow(`${name} has the wrong type`);
      expect(() => parseTaskConfig(config)).toThrow(`invalid value for the "${name}" field`);
    },
  );

  it("names the same field as it always has when several are wrong", () => {
    const config = { ...MINIMAL, gpu: "x", network_mode: 1, command: 5 };
    expect(() => decodeStoredConfig(config)).toThrow("command has the wrong type");
    expect(() => decodeStoredConfig({ ...config, command: null })).toThrow("network_mode has the wrong type");
    expect(() => decodeStoredConfig({ ...config, image_name: "" })).toThrow("config has no image_name");
  });

  it("keeps the fields of a list's objects the submit drops, and a newer release's", () => {
    const mounts = [{ instance_path: "relative", path: "/b", optional: true, mode: "ro" }];
    expect(decodeStoredConfig({ ...MINIMAL, instance_mounts: mounts }).instance_mounts).toEqual(mounts);
    expect(
      parseTaskConfig({ ...MINIMAL, instance_mounts: [{ ...mounts[0], instance_path: "/a" }] }).config
        .instance_mounts,
    ).toEqual([{ instance_path: "/a", path: "/b" }]);
  });

  it("never runs a field's rule on a stored value (an older release's config restores)", () => {
    const config = { ...MINIMAL, gpu: 100_000, network_mode: "macvlan", command: [], container_user: "" };
    expect(() => parseTaskConfig(config)).toThrow();
    const stored = decodeStoredConfig(config);
    expect(stored).toMatchObject({ gpu: 100_000, network_mode: "macvlan", container_user: "root" });
    expect(stored).not.toHaveProperty("command");
  });
});
