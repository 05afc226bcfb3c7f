import { describe, expect, it } from "vitest";
import { containerNameFor } from "./container-name.js";

describe("containerNameFor", () => {
  it.each([
    ["vllm-0-0", "66a886db-86db-4cf9-8c06-8984ad15dde2", "vllm-0-0-cff1b8da"],
    ["vllm-0-0", "41728e34-bf7e-41da-bf0e-0f46764b1752", "vllm-0-0-bb2a28c3"],
    ["llamacpp-0-0", "66a886db-86db-4cf9-8c06-8984ad15dde2", "llamacpp-0-0-58d1283d"],
  ])("matches dstack-shim's golden vector (%s, %s) -> %s", (name, id, expected) => {
    expect(containerNameFor(name, id)).toBe(expected);
  });

  it("hashes name and id with a separator, so moving a character across the boundary changes the hash", () => {
    expect(containerNameFor("ab", "c").slice(-8)).not.toBe(containerNameFor("a", "bc").slice(-8));
  });
});
