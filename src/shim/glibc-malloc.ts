/**
 * glibc's allocator controls, called through Node's `node:ffi`. Why the shim needs them: V8's
 * compiler zones, HTTP parsers and the start-up's schema compilation allocate with malloc on
 * several threads, and glibc keeps what they free in per-thread arenas for reuse. On an idle shim
 * that is 6 MB of its 80 MB resident set that no later request needs, which `malloc_trim(0)` gives
 * back; and each arena fragments on its own over task churn, which a cap on their number limits
 * (BENCHMARKS.md, B6). No library does this (a native addon would need a compiler on the host or
 * a prebuilt binary per platform); `node:ffi` ships with the Node.js the project pins.
 */

/**
 * The C heap's arenas a serving shim may use. glibc gives each thread that allocates at the same
 * moment as another an arena of its own (up to 8 per core), and each keeps its own free space and
 * fragments on its own: with the default, 500 submit → exit → remove cycles left 9 arenas holding
 * 5.4 MB; capped by `serve` ({@link GlibcMalloc.limitArenas}), 5 holding 3.0 MB. V8's worker
 * threads take theirs before any script runs; only the environment ({@link ARENA_ENV}, which the
 * bundle's shebang, `supervise` and the systemd unit set) caps those: after 1,600 cycles, 1
 * arena holding 1.9 MB against 6 holding 4.4 MB. One arena, glibc's main one, and no thread
 * arena at all: side by side from cycle 1,000 to 3,000, a shim capped at 2 grew 2.3 MB (its
 * thread arena 1.0 → 1.7 MB), one capped at 1 grew 1.6 MB (B6-slope). The shim's work is on one
 * thread; the rest (libuv's file-system pool, V8's compiler and collector) is short and rare,
 * so they seldom wait for the arena's lock.
 */
export const MALLOC_ARENAS = 1;

/** glibc's environment variable for {@link MALLOC_ARENAS}, read once as the process starts. */
export const ARENA_ENV = "MALLOC_ARENA_MAX";

/** The part of `node:ffi` this module uses (Node 26; the module is experimental). */
interface FfiModule {
  readonly types: { readonly UINT_64: unknown; readonly INT_32: unknown };
  dlopen(
    path: string,
    symbols: Record<string, { arguments: unknown[]; return: unknown }>,
  ): { functions: Record<string, (...args: unknown[]) => unknown> };
}

/** Loads `node:ffi`; undefined where this Node.js has none or it is not allowed (`--permission`). */
export type FfiLoader = () => FfiModule | undefined;

/**
 * `node:ffi` without its one-time ExperimentalWarning on stderr: that line would tell an
 * operator nothing they can act on. Only that warning is held back, only while the module loads.
 */
const loadFfi: FfiLoader = () => {
  const own = Object.getOwnPropertyDescriptor(process, "emitWarning");
  const emitWarning = process.emitWarning.bind(process) as (...args: unknown[]) => void;
  Object.defineProperty(process, "emitWarning", {
    configurable: true,
    writable: true,
    value: (warning: unknown, ...rest: unknown[]): void => {
      if (!String(warning).startsWith("FFI is an experimental feature")) emitWarning(warning, ...rest);
    },
  });
  try {
    return process.getBuiltinModule("node:ffi") as FfiModule | undefined;
  } catch {
    return undefined;
  } finally {
    if (own !== undefined) Object.defineProperty(process, "emitWarning", own);
  }
};

/** The glibc allocator's controls the shim uses. */
export interface GlibcMalloc {
  /** `malloc_trim(0)`: gives the C heap's free pages back to the system (under a millisecond). */
  readonly trim: () => void;
  /**
   * `mallopt(M_ARENA_MAX, max)`: threads that have no arena yet share the existing ones once
   * there are `max`. Call it before the threads allocate (first thing in `serve`). False where
   * glibc refused the setting.
   */
  readonly limitArenas: (max: number) => boolean;
}

/** glibc's `M_ARENA_MAX` parameter of `mallopt` (malloc.h). */
const M_ARENA_MAX = -8;

/**
 * The glibc allocator of this process, or undefined where there is none to call: not Linux, a C
 * library other than glibc (musl has no `libc.so.6`), or no `node:ffi`.
 */
export function loadGlibcMalloc(load: FfiLoader = loadFfi): GlibcMalloc | undefined {
  if (process.platform !== "linux") return undefined;
  try {
    const ffi = load();
    if (ffi === undefined) return undefined;
    const { INT_32, UINT_64 } = ffi.types;
    const libc = ffi.dlopen("libc.so.6", {
      malloc_trim: { arguments: [UINT_64], return: INT_32 },
      mallopt: { arguments: [INT_32, INT_32], return: INT_32 },
    });
    const { malloc_trim: mallocTrim, mallopt } = libc.functions;
    if (mallocTrim === undefined || mallopt === undefined) return undefined;
    return {
      trim: () => void mallocTrim(0n),
      // mallopt answers 1 on success, 0 on error.
      limitArenas: (max) => mallopt(M_ARENA_MAX, max) === 1,
    };
  } catch {
    return undefined;
  }
}
