import { mkdir, open, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { syncDirectory } from "./durable-write.js";
import { describeFsError } from "./log-file-sink.js";

/** How often a degraded home is probed (write, fsync, rename, delete of a small file). */
export const STORAGE_PROBE_INTERVAL_MS = 2_000;

/**
 * Error codes that mean the home's file system cannot take a durable write right now (full,
 * read-only, failing, or made immutable), as opposed to a bug or a missing file.
 */
const STORAGE_ERROR_CODES: ReadonlySet<string> = new Set([
  "ENOSPC",
  "EDQUOT",
  "EROFS",
  "EIO",
  "EPERM",
  "EACCES",
  "EFBIG",
  "ENOMEM",
  "EMFILE",
  "ENFILE",
  "EBUSY",
  "ESTALE",
  "EUCLEAN",
]);

/** The error (or its causes) carries an errno code of a storage fault. */
export function isStorageError(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string" && STORAGE_ERROR_CODES.has(code)) return true;
    e = e.cause;
  }
  return false;
}

/** The innermost storage error of a chain, described as `CODE: text`. */
export function describeStorageError(error: unknown): string {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; depth++) {
    const code = (e as NodeJS.ErrnoException).code;
    if (typeof code === "string" && STORAGE_ERROR_CODES.has(code)) return describeFsError(e);
    e = e.cause;
  }
  return describeFsError(error);
}

/**
 * The home cannot take the durable write a request needs: nothing was changed, in memory or on
 * disk, and the request is safe to retry (HTTP 503).
 */
export class StorageUnavailableError extends Error {
  override readonly name = "StorageUnavailableError";
  /** `ENOSPC: no space left on device` */
  readonly detail: string;
  constructor(cause: unknown) {
    const detail = describeStorageError(cause);
    super(`storage unavailable: ${detail}`, { cause });
    this.detail = detail;
  }
}

/** The home's storage as last seen. */
export type StorageState =
  | { readonly state: "ok"; readonly since: number }
  | { readonly state: "degraded"; readonly since: number; readonly error: string };

/** What the health needs besides the file system. */
export interface StorageHealthHooks {
  /** Logs a transition (one line each way). */
  readonly log?: (level: "error" | "info", fields: Record<string, unknown>, msg: string) => void;
  /** The metric `taskshim_storage_up`. */
  readonly observe?: (up: boolean) => void;
  /**
   * After a successful probe: write what is not durable yet. Resolves true when everything was
   * written; the home stays degraded otherwise.
   */
  readonly catchUp?: () => Promise<boolean>;
  /** The monotonic clock (ms) that measures how long the home was degraded; tests pass their own. */
  readonly now?: () => number;
  /** The wall clock (ms) of `since`, which users see; tests pass their own. */
  readonly wallNow?: () => number;
}

/**
 * Whether the shim's home can take durable writes. A failed durable write marks it degraded
 * (`markFailed`); while degraded, `run` probes it every 2 s — write, fsync, rename and delete a
 * small file in `<home>/runners` — and once a probe and the catch-up (the writes that were
 * deferred) succeed, it is ok again.
 */
export class StorageHealth {
  private current: StorageState;
  private readonly now: () => number;
  private readonly wallNow: () => number;
  /** Monotonic ms of the change to degraded (its length is logged when it ends). */
  private degradedAt = 0;

  constructor(
    private readonly dir: string,
    private readonly hooks: StorageHealthHooks = {},
  ) {
    this.now = hooks.now ?? (() => performance.now());
    this.wallNow = hooks.wallNow ?? Date.now;
    this.current = { state: "ok", since: this.wallNow() };
    hooks.observe?.(true);
  }

  /** The storage state as last seen. */
  state(): StorageState {
    return this.current;
  }

  get degraded(): boolean {
    return this.current.state === "degraded";
  }

  /** A durable write failed with a storage error: the home is degraded until a probe clears it. */
  markFailed(error: unknown): void {
    const detail = describeStorageError(error);
    if (this.current.state === "degraded") {
      this.current = { ...this.current, error: detail };
      return;
    }
    this.current = { state: "degraded", since: this.wallNow(), error: detail };
    this.degradedAt = this.now();
    this.hooks.observe?.(false);
    this.hooks.log?.("error", { error: detail }, "storage degraded: durable writes fail; retrying every 2 s");
  }

  /**
   * One probe: write, fsync, rename and delete a small file. Returns the error, or undefined
   * when the home took it. (It does not change the state: see `check`.)
   */
  async probe(): Promise<Error | undefined> {
    const temp = join(this.dir, `.storage-probe-${process.pid}.tmp`);
    const target = join(this.dir, `.storage-probe-${process.pid}`);
    try {
      await mkdir(this.dir, { recursive: true, mode: 0o755 });
      const file = await open(temp, "w", 0o600);
      try {
        await file.writeFile(`${this.wallNow()}\n`);
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temp, target);
      await unlink(target);
      await syncDirectory(this.dir);
      return undefined;
    } catch (error) {
      await unlink(temp).catch(() => undefined);
      await unlink(target).catch(() => undefined);
      return error as Error;
    }
  }

  /** Probes; a failure marks the home degraded, a success with a complete catch-up clears it. */
  async check(): Promise<boolean> {
    const failed = await this.probe();
    if (failed) {
      this.markFailed(failed);
      return false;
    }
    if (this.current.state === "ok") return true;
    // Stryker disable next-line ArrowFunction: a catch-up that throws reads as undefined, as falsy as false below.
    const caughtUp = this.hooks.catchUp ? await this.hooks.catchUp().catch(() => false) : true;
    // The catch-up's own failures re-mark the home (with their error); only a clean one clears it.
    if (!caughtUp) return false;
    this.current = { state: "ok", since: this.wallNow() };
    this.hooks.observe?.(true);
    this.hooks.log?.(
      "info",
      { degradedMs: Math.round(this.now() - this.degradedAt) },
      "storage writable again; deferred writes done",
    );
    return true;
  }

  /** Probes every 2 s while degraded, until the signal aborts. */
  async run(signal: AbortSignal, intervalMs = STORAGE_PROBE_INTERVAL_MS): Promise<void> {
    while (!signal.aborted) {
      await sleep(intervalMs, undefined, { signal }).catch(() => undefined);
      if (!signal.aborted && this.current.state === "degraded") await this.check();
    }
  }
}
