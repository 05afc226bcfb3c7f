import { describe, expect, it } from "vitest";
import { loadMallocTrim } from "./malloc-trim.js";

describe("loadMallocTrim", () => {
  it("calls glibc's malloc_trim on this host (Linux, glibc, Node 26), printing no warning", async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning.message);
    const emitWarning: unknown = Object.getOwnPropertyDescriptor(process, "emitWarning")?.value;
    process.on("warning", onWarning);
    try {
      const trim = loadMallocTrim();
      expect(trim).toBeTypeOf("function");
      trim?.();
      expect(Object.getOwnPropertyDescriptor(process, "emitWarning")?.value).toBe(emitWarning); // put back once the module is loaded
      process.emitWarning("a later warning still shows");
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings).toEqual(["a later warning still shows"]);
  });

  it("is absent where there is no node:ffi, or it fails", () => {
    expect(loadMallocTrim(() => undefined)).toBeUndefined();
    expect(
      loadMallocTrim(() => {
        throw new Error("ERR_ACCESS_DENIED");
      }),
    ).toBeUndefined();
    const noLibc = {
      types: { UINT_64: "u64", INT_32: "i32" },
      dlopen: (): never => {
        throw new Error("dlopen failed: libc.so.6: cannot open shared object file");
      },
    };
    expect(loadMallocTrim(() => noLibc)).toBeUndefined();
  });
});
