import { describe, expect, it } from "vitest";
import { loadGlibcMalloc } from "./glibc-malloc.js";

describe("loadGlibcMalloc", () => {
  it("calls glibc's malloc_trim on this host (Linux, glibc, Node 26), printing no warning", async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning.message);
    const emitWarning: unknown = Object.getOwnPropertyDescriptor(process, "emitWarning")?.value;
    process.on("warning", onWarning);
    try {
      const malloc = loadGlibcMalloc();
      expect(malloc).toBeDefined();
      malloc?.trim();
      expect(Object.getOwnPropertyDescriptor(process, "emitWarning")?.value).toBe(emitWarning); // put back once the module is loaded
      process.emitWarning("a later warning still shows");
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings).toEqual(["a later warning still shows"]);
  });

  it("is absent where there is no node:ffi, or it fails", () => {
    expect(loadGlibcMalloc(() => undefined)).toBeUndefined();
    expect(
      loadGlibcMalloc(() => {
        throw new Error("ERR_ACCESS_DENIED");
      }),
    ).toBeUndefined();
    const noLibc = {
      types: { UINT_64: "u64", INT_32: "i32" },
      dlopen: (): never => {
        throw new Error("dlopen failed: libc.so.6: cannot open shared object file");
      },
    };
    expect(loadGlibcMalloc(() => noLibc)).toBeUndefined();
  });

  it("limits the arenas with mallopt(M_ARENA_MAX), and says when glibc refused", () => {
    const calls: unknown[][] = [];
    let answer = 1;
    const fake = {
      types: { UINT_64: "u64", INT_32: "i32" },
      dlopen: () => ({
        functions: {
          malloc_trim: (): number => 1,
          mallopt: (...args: unknown[]): number => (calls.push(args), answer),
        },
      }),
    };
    const malloc = loadGlibcMalloc(() => fake);
    expect(malloc?.limitArenas(2)).toBe(true);
    answer = 0;
    expect(malloc?.limitArenas(2)).toBe(false);
    expect(calls).toEqual([
      [-8, 2],
      [-8, 2],
    ]);
    // This host's glibc takes it (8: no lower than what the test process may already use).
    expect(loadGlibcMalloc()?.limitArenas(8)).toBe(true);
  });
});
