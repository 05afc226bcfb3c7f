/*
 * Test support: a journaling wrapper of `node:fs/promises`, so unit tests can observe the
 * system calls a durable write makes (and the order it makes them in) without a power cut.
 * Use it from a test file with
 *
 *   vi.mock("node:fs/promises", async (importOriginal) =>
 *     (await import("../testing/fs-journal.js")).journalingFs(await importOriginal()));
 *
 * This module must not import `node:fs/promises` itself (it would import its own mock).
 */
import { constants } from "node:fs";
import { dirname, resolve } from "node:path";

/** One observed call. `path` is absolute; a handle's calls carry the path it was opened with. */
export type FsEvent =
  | { readonly op: "open"; readonly path: string; readonly writable: boolean; readonly fd: number }
  | {
      readonly op: "write" | "sync" | "close" | "chmod" | "chown" | "truncate";
      readonly path: string;
      readonly fd: number;
    }
  | { readonly op: "rename"; readonly from: string; readonly to: string }
  | { readonly op: "unlink" | "rm" | "mkdir" | "chmod-path"; readonly path: string };

/** Every call made through the wrapped module since the last {@link resetFsJournal}. */
export const fsJournal: FsEvent[] = [];

/** Failures to inject: the next call of `op` on `path` rejects with `error` (once). */
const failures: { op: string; path: string; error: Error }[] = [];

/** Empties the journal and forgets injected failures not yet used. */
export function resetFsJournal(): void {
  fsJournal.length = 0;
  failures.length = 0;
}

/**
 * Makes the next `op` (a `node:fs/promises` function name, e.g. `"rm"`) on `path` reject with
 * an errno error `code`, as a busy mount or an immutable file would, without touching the disk.
 */
export function failNextFsCall(op: string, path: string, code: string): void {
  failures.push({ op, path: resolve(path), error: Object.assign(new Error(`${code}: injected`), { code }) });
}

function injected(op: string, path: string): Error | undefined {
  const at = failures.findIndex((f) => f.op === op && f.path === path);
  return at === -1 ? undefined : failures.splice(at, 1)[0]?.error;
}

const WRITE_FLAGS = constants.O_WRONLY | constants.O_RDWR | constants.O_APPEND | constants.O_TRUNC;

/** Whether open flags allow writing (`"r"` and `O_RDONLY` alone do not). */
export function isWritableFlags(flags: unknown): boolean {
  if (flags === undefined || flags === null) return false;
  if (typeof flags === "number") return (flags & WRITE_FLAGS) !== 0;
  return typeof flags === "string" && /[wa+]/.test(flags);
}

const HANDLE_OPS: Readonly<Record<string, FsEvent["op"]>> = {
  writeFile: "write",
  write: "write",
  writev: "write",
  appendFile: "write",
  sync: "sync",
  datasync: "sync",
  close: "close",
  chmod: "chmod",
  chown: "chown",
  truncate: "truncate",
};

type FsPromises = typeof import("node:fs/promises");
type AnyFn = (...args: unknown[]) => unknown;

let handles = 0;

/**
 * The module `real` with its path calls and its file handles journaled into {@link fsJournal}.
 * Behaviour is unchanged: every call goes through to `real`.
 */
export function journalingFs(real: FsPromises): FsPromises {
  // The paths of the handles open now, by their real fd: a `/proc/self/fd/N/name` path (how code
  // without openat works relative to an opened directory) is journaled as `<N's path>/name`.
  const openPaths = new Map<number, string>();
  const path = (p: unknown): string => {
    const viaFd = /^\/proc\/self\/fd\/(\d+)(\/.*)?$/.exec(String(p));
    const base = viaFd ? openPaths.get(Number(viaFd[1])) : undefined;
    return base === undefined ? resolve(String(p)) : resolve(`${base}${viaFd?.[2] ?? ""}`);
  };
  const call = (name: keyof FsPromises, args: unknown[]): unknown =>
    (real[name] as unknown as AnyFn)(...args);
  const wrapped: Record<string, unknown> = { ...real };
  wrapped.open = async (...args: unknown[]) => {
    const handle = (await call("open", args)) as { fd: number };
    const opened = { path: path(args[0]), fd: ++handles };
    openPaths.set(handle.fd, opened.path);
    fsJournal.push({ op: "open", ...opened, writable: isWritableFlags(args[1]) });
    return new Proxy(handle, {
      get(target, key, receiver) {
        const value = Reflect.get(target, key, receiver) as unknown;
        const op = typeof key === "string" ? HANDLE_OPS[key] : undefined;
        if (op === undefined || typeof value !== "function") {
          return typeof value === "function" ? (value as AnyFn).bind(target) : value;
        }
        return (...callArgs: unknown[]) => {
          fsJournal.push({ op, ...opened } as FsEvent);
          return (value as AnyFn).apply(target, callArgs);
        };
      },
    });
  };
  wrapped.rename = (...args: unknown[]) => {
    fsJournal.push({ op: "rename", from: path(args[0]), to: path(args[1]) });
    const failure = injected("rename", path(args[0]));
    return failure ? Promise.reject(failure) : call("rename", args);
  };
  for (const [name, op] of [
    ["unlink", "unlink"],
    ["rm", "rm"],
    ["rmdir", "rm"],
    ["mkdir", "mkdir"],
    ["chmod", "chmod-path"],
  ] as const) {
    wrapped[name] = (...args: unknown[]) => {
      fsJournal.push({ op, path: path(args[0]) });
      const failure = injected(name, path(args[0]));
      return failure ? Promise.reject(failure) : call(name, args);
    };
  }
  // Whole-file calls by path write in place: journaled as an open for writing plus a write.
  for (const name of ["writeFile", "appendFile", "truncate", "copyFile"] as const) {
    wrapped[name] = (...args: unknown[]) => {
      const target = path(name === "copyFile" ? args[1] : args[0]);
      const fd = ++handles;
      fsJournal.push({ op: "open", path: target, writable: true, fd }, { op: "write", path: target, fd });
      return call(name, args);
    };
  }
  return { ...wrapped, default: wrapped } as unknown as FsPromises;
}

/**
 * The ways the journal falls short of a durable replace of `target`: a temp file in the same
 * directory opened for writing, written, fsynced and closed, then renamed over the target, then
 * the directory opened and fsynced; and no write to the target in place. Empty when it is one.
 */
export function durableReplaceViolations(journal: readonly FsEvent[], target: string): string[] {
  const file = resolve(target);
  const dir = dirname(file);
  const problems: string[] = [];
  for (const event of journal) {
    if (event.op === "open" && event.path === file && event.writable)
      problems.push("target opened for writing");
    if (event.op === "truncate" && event.path === file) problems.push("target truncated in place");
  }
  const renameAt = journal.findLastIndex((e) => e.op === "rename" && e.to === file);
  if (renameAt === -1) return [...problems, "no rename onto the target"];
  const rename = journal[renameAt] as Extract<FsEvent, { op: "rename" }>;
  const temp = rename.from;
  if (temp === file) problems.push("renamed onto itself");
  if (dirname(temp) !== dir) problems.push(`temp file ${temp} is not in ${dir}`);
  const before = journal.slice(0, renameAt);
  const openAt = before.findLastIndex((e) => e.op === "open" && e.path === temp && e.writable);
  if (openAt === -1) return [...problems, "temp file never opened for writing before the rename"];
  const fd = (before[openAt] as Extract<FsEvent, { op: "open" }>).fd;
  const onTemp = before.slice(openAt + 1).map((e) => ("fd" in e && e.fd === fd ? e.op : undefined));
  const lastWrite = onTemp.lastIndexOf("write");
  const lastSync = onTemp.lastIndexOf("sync");
  const close = onTemp.indexOf("close");
  if (lastWrite === -1) problems.push("nothing written to the temp file");
  if (lastSync === -1 || lastSync < lastWrite) problems.push("temp file not fsynced after its last write");
  if (close === -1) problems.push("temp file not closed before the rename");
  else if (close < lastSync) problems.push("temp file closed before its fsync");
  if (!dirSyncedAfter(journal, renameAt, dir)) problems.push(`directory ${dir} not fsynced after the rename`);
  return problems;
}

/**
 * Whether `dir` was fsynced after journal index `after`, through a handle of it opened before or
 * after that point (an fsync of a directory makes every entry it holds at that moment durable).
 */
export function dirSyncedAfter(journal: readonly FsEvent[], after: number, dir: string): boolean {
  const target = resolve(dir);
  return journal.slice(after + 1).some((e) => e.op === "sync" && e.path === target);
}
