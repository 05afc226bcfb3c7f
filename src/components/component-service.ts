import { createHash } from "node:crypto";
import { constants, existsSync, type Stats } from "node:fs";
import { chmod, open, rename, stat, unlink, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";
import { deadlineSignal } from "../exec/deadline-signal.js";
import { OperationBound } from "../exec/operation-bound.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { syncDirectory } from "../state/durable-write.js";
import { redactUrl, redactUrlsIn } from "./redact-url.js";
import { logExpected } from "../logging/log-fields.js";

/** The component names of the wire contract. */
export type ComponentName = "dstack-runner" | "dstack-shim";
/** A component's install status. */
export type ComponentStatus = "not-installed" | "installed" | "installing" | "error";

/** One entry of `GET /api/components`. */
export interface ComponentInfo {
  readonly name: ComponentName;
  readonly version: string;
  readonly status: ComponentStatus;
  /**
   * taskshim extension, dstack-shim only: the `build_id` that `<binary> version --json` prints,
   * when the binary is a taskshim that has one.
   */
  readonly build_id?: string;
  /**
   * taskshim extension: why the last install of this component failed (the status and version
   * then describe the binary still in place). Cleared when the next install starts.
   */
  readonly error?: string;
}

/** An install request that cannot be accepted; `kind` maps to 400 or 409. */
export class ComponentRequestError extends Error {
  override readonly name = "ComponentRequestError";
  constructor(
    readonly kind: "invalid" | "busy",
    message: string,
  ) {
    super(message);
  }
}

/** An accepted install that failed: the download, its source, its digest or its verification. */
export class ComponentInstallError extends Error {
  override readonly name = "ComponentInstallError";
}

/** Tuning of a {@link ComponentService}; the defaults are the shim's. */
export interface ComponentServiceOptions {
  /** The deadline of one download, http(s) or file (default 10 min). */
  readonly downloadTimeoutMs?: number;
}

const DOWNLOAD_TIMEOUT_MS = 10 * 60 * 1000;
const VERSION_TIMEOUT_MS = 10_000;
/** Output of `<binary> --version`: `<name> version <X>`. */
const VERSION_LINE = /^(dstack-runner|dstack-shim|taskshim) version (\S+)$/;
/** The names each component's binary may give in its version line: taskshim is a dstack-shim. */
const BINARY_NAMES: Record<ComponentName, readonly string[]> = {
  "dstack-runner": ["dstack-runner"],
  "dstack-shim": ["dstack-shim", "taskshim"],
};
/** A build id as `version --json` may give it: printable ASCII, not a screenful. */
const BUILD_ID = /^[\x20-\x7e]{1,256}$/;
const READ_CHUNK_BYTES = 64 * 1024;
const ELF_MAGIC = Buffer.from([0x7f, 0x45, 0x4c, 0x46]);

/** What a look at a binary found: what the slot reports, and why it is not installed. */
interface Observation {
  readonly status: "not-installed" | "installed" | "error";
  readonly version: string;
  readonly buildId?: string;
  /** Why the file does not count as this component's binary (for an install's error). */
  readonly problem?: string;
}

const NOT_INSTALLED: Observation = { status: "not-installed", version: "" };

interface ComponentSlot {
  readonly name: ComponentName;
  readonly path: string;
  status: ComponentStatus;
  version: string;
  buildId: string | undefined;
  /** The last install's failure, until the next install starts. */
  error: string | undefined;
  /** The URL (and digest) of the last successful install, to skip a repeated one (#3953). */
  installedFrom?: string;
  /**
   * Bumped when an install starts and when it ends. A version check writes its result only if
   * the generation is still the one it began under: an install that started meanwhile owns the
   * slot, and the binary the check ran may since have been replaced.
   */
  generation: number;
}

/** A download's body, one chunk at a time. */
interface ChunkSource {
  /** The next chunk, or undefined at the end. */
  next(): Promise<Uint8Array | undefined>;
  /** Releases the source without waiting for it (a read may still be stuck in it). */
  close(): void;
}

/** How far an install got: once renamed, the target is the verified download. */
interface InstallProgress {
  renamed?: Observation;
}

/**
 * The dstack-runner and dstack-shim binaries on this host: their versions, and background installs.
 * An install downloads to a 0600 temp file beside the target, checks the sha256 when given, runs
 * the temp's `--version` (mode 0700), and only a binary that printed this component's version line
 * is made 0755, renamed over the target (a running process keeps the old inode) and the directory
 * fsynced. Anything else leaves the target as it was, and the slot reports what is there.
 */
export class ComponentService {
  private readonly slots: Record<ComponentName, ComponentSlot>;
  private readonly installs = new Set<Promise<void>>();
  private checked: Promise<void> = Promise.resolve();
  private readonly downloadTimeoutMs: number;

  constructor(
    paths: { runner: string; shim: string },
    private readonly commands: CommandRunner,
    private readonly log: Logger,
    private readonly shutdown: AbortSignal,
    options: ComponentServiceOptions = {},
  ) {
    const slot = (name: ComponentName, path: string): ComponentSlot => ({
      name,
      path,
      status: "not-installed",
      version: "",
      buildId: undefined,
      error: undefined,
      generation: 0,
    });
    this.slots = {
      "dstack-runner": slot("dstack-runner", paths.runner),
      "dstack-shim": slot("dstack-shim", paths.shim),
    };
    this.downloadTimeoutMs = options.downloadTimeoutMs ?? DOWNLOAD_TIMEOUT_MS;
  }

  /**
   * Checks both binaries' versions (at startup; installs check their own). It runs in the
   * background so it does not delay serving; `list()` waits for it, so nobody ever sees a
   * component as "not-installed" only because it was not checked yet. An install that starts
   * meanwhile wins: the check's result is dropped.
   */
  refresh(): Promise<void> {
    this.checked = Promise.all(
      Object.values(this.slots)
        .filter((slot) => slot.status !== "installing")
        .map((slot) => this.check(slot)),
    ).then(() => undefined);
    return this.checked;
  }

  /**
   * The dstack-runner binary's path when it is missing and no install of it is under way: a task
   * without `command` cannot start then (its container bind-mounts the binary).
   */
  missingRunner(): string | undefined {
    const slot = this.slots["dstack-runner"];
    return slot.status === "installing" || existsSync(slot.path) ? undefined : slot.path;
  }

  /** Both components, dstack-runner first, as last checked. */
  async list(): Promise<ComponentInfo[]> {
    await this.checked;
    return [this.slots["dstack-runner"], this.slots["dstack-shim"]].map((slot) => ({
      name: slot.name,
      version: slot.version,
      status: slot.status,
      ...(slot.buildId !== undefined ? { build_id: slot.buildId } : {}),
      ...(slot.error !== undefined ? { error: slot.error } : {}),
    }));
  }

  /** Validates a request and starts the install in the background. */
  install(name: unknown, url: unknown, sha256: unknown): void {
    if (typeof name !== "string" || name === "") throw new ComponentRequestError("invalid", "empty name");
    if (name !== "dstack-runner" && name !== "dstack-shim")
      throw new ComponentRequestError("invalid", "unknown component");
    if (typeof url !== "string" || url === "") throw new ComponentRequestError("invalid", "empty url");
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new ComponentRequestError("invalid", "invalid url");
    }
    if (!["http:", "https:", "file:"].includes(parsed.protocol)) {
      throw new ComponentRequestError("invalid", "unsupported url scheme (http, https or file)");
    }
    if (
      sha256 !== undefined &&
      sha256 !== null &&
      (typeof sha256 !== "string" || !/^[0-9a-f]{64}$/i.test(sha256))
    ) {
      throw new ComponentRequestError("invalid", "sha256 must be 64 hex digits");
    }
    const slot = this.slots[name];
    if (slot.status === "installing") throw new ComponentRequestError("busy", "already installing");
    const source = `${url}#${typeof sha256 === "string" ? sha256.toLowerCase() : ""}`;
    if (slot.status === "installed" && slot.installedFrom === source) {
      this.log.info(
        { component: name, url: redactUrl(url) },
        "component already installed from this url; not downloading again",
      );
      return;
    }
    const before: Observation = {
      status: slot.status,
      version: slot.version,
      ...(slot.buildId !== undefined ? { buildId: slot.buildId } : {}),
    };
    // The install owns the slot from here: a version check under way drops its result.
    slot.generation += 1;
    slot.status = "installing";
    slot.version = "";
    slot.buildId = undefined;
    slot.error = undefined;
    const job = this.runInstall(
      slot,
      parsed,
      typeof sha256 === "string" ? sha256.toLowerCase() : undefined,
      source,
      before,
    )
      .catch((error: unknown) => {
        // runInstall handles every failure of the install; this is a bug's last resort, so the
        // slot never stays "installing" (which would answer every later install 409).
        slot.generation += 1;
        slot.status = "error";
        slot.error = redactUrlsIn(errorMessage(error));
        this.log.error({ component: name, err: error }, "component install failed unexpectedly");
      })
      .finally(() => this.installs.delete(job));
    this.installs.add(job);
  }

  /** Waits for background installs (shutdown). */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.installs]);
  }

  /**
   * One install from start to end: on success the slot reports the verified binary, on failure
   * the binary in place (re-checked) and the failure in `error` and the log.
   */
  private async runInstall(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    source: string,
    before: Observation,
  ): Promise<void> {
    const fields = { component: slot.name, url: redactUrl(url.href) };
    const progress: InstallProgress = {};
    let seen: Observation;
    let failure: unknown;
    try {
      seen = await this.installVerified(slot, url, sha256, progress);
    } catch (error) {
      failure = error;
      seen = await this.inPlaceAfterFailure(slot, progress, before);
    }
    // The install ends: a check that began during it ran a binary that may be gone.
    slot.generation += 1;
    this.apply(slot, seen);
    if (failure === undefined) {
      slot.installedFrom = source;
      this.log.info(
        { component: slot.name, version: seen.version, ...(seen.buildId ? { build_id: seen.buildId } : {}) },
        "component installed",
      );
      return;
    }
    slot.error = redactUrlsIn(errorMessage(failure));
    logExpected(
      this.log,
      "error",
      { ...fields, in_place: { status: seen.status, version: seen.version } },
      failure,
      "component install failed",
    );
  }

  /** Downloads, verifies, and renames over the target; throws with the target untouched. */
  private async installVerified(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    progress: InstallProgress,
  ): Promise<Observation> {
    const dir = dirname(slot.path);
    const temp = join(dir, `.${basename(slot.path)}.download-${process.pid}-${Date.now()}`);
    try {
      const digest = await this.download(url, temp);
      if (sha256 !== undefined && digest !== sha256) {
        throw new ComponentInstallError(`sha256 mismatch: expected ${sha256}, got ${digest}`);
      }
      // Node's spawn, like execvp, hands a file the kernel cannot execute (ENOEXEC) to /bin/sh:
      // an error page or a copied text file would be run as a shell script, as the shim's user.
      if (!(await isExecutableFormat(temp))) {
        throw new ComponentInstallError(
          `the download is not a ${slot.name} binary: neither an ELF executable nor a #! script`,
        );
      }
      // Runnable by its owner alone while unverified: it may be anything (an error page, a copy
      // of a file nobody else may read), and it must not be readable by others meanwhile.
      await chmod(temp, 0o700);
      const seen = await this.probe(slot.name, temp);
      if (seen.status !== "installed") {
        throw new ComponentInstallError(
          `the download is not a ${slot.name} binary: ${seen.problem ?? "it reports no version"}`,
        );
      }
      await chmod(temp, 0o755);
      await rename(temp, slot.path);
      progress.renamed = seen;
      await syncDirectory(dir);
      return seen;
    } finally {
      if (!progress.renamed) await unlink(temp).catch(() => undefined);
    }
  }

  /** What is at the target after a failed install: what is there, not a blanket `error`. */
  private async inPlaceAfterFailure(
    slot: ComponentSlot,
    progress: InstallProgress,
    before: Observation,
  ): Promise<Observation> {
    // Failed after the rename (the directory's fsync): the target is the verified download.
    if (progress.renamed) return progress.renamed;
    // Shutting down: run nothing more. The target was not touched, so it is what it was.
    if (this.shutdown.aborted) return existsSync(slot.path) ? before : NOT_INSTALLED;
    return this.probe(slot.name, slot.path);
  }

  /** Downloads `url` into a new 0600 file `temp` under the download deadline; returns its sha256. */
  private async download(url: URL, temp: string): Promise<string> {
    using deadline = deadlineSignal(this.shutdown, this.downloadTimeoutMs);
    const signal = deadline.signal;
    const hash = createHash("sha256");
    // The temp file first: nothing is opened at the source that a failure here would leave open.
    const file = await open(temp, "wx", 0o600);
    let source: ChunkSource | undefined;
    try {
      const opening = url.protocol === "file:" ? this.fileSource(url) : this.httpSource(url, signal);
      source = await untilAborted(opening, signal).catch((error: unknown) => {
        // An open that ends after we gave up on it is closed then.
        void opening.then(
          (late) => late.close(),
          () => undefined,
        );
        throw error;
      });
      for (;;) {
        // Each read races the signal: a peer that stalls mid-body, or a read stuck in the kernel,
        // cannot hold the install past its deadline or the shim's shutdown.
        const chunk = await untilAborted(source.next(), signal);
        if (chunk === undefined) break;
        hash.update(chunk);
        await file.write(chunk);
      }
      await file.sync();
    } catch (error) {
      if (signal.aborted) {
        throw this.shutdown.aborted
          ? new ComponentInstallError("shim shutting down", { cause: this.shutdown.reason })
          : new ComponentInstallError(`download did not finish within ${this.downloadTimeoutMs} ms`, {
              cause: error,
            });
      }
      throw error;
    } finally {
      source?.close();
      await file.close();
    }
    return hash.digest("hex");
  }

  /** An HTTP(S) answer's body; the signal aborts the request and the body. */
  private async httpSource(url: URL, signal: AbortSignal): Promise<ChunkSource> {
    let response: Response;
    try {
      response = await fetch(url, { signal, redirect: "follow" });
    } catch (error) {
      const cause =
        error instanceof Error && error.cause !== undefined ? `: ${errorMessage(error.cause)}` : "";
      throw new ComponentInstallError(redactUrlsIn(`download failed: ${errorMessage(error)}${cause}`), {
        cause: error,
      });
    }
    const body = response.body;
    if (response.status !== 200 || !body) {
      void body?.cancel().catch(() => undefined);
      throw new ComponentInstallError(`download failed: HTTP ${response.status}`);
    }
    // Node's types give fetch's body as a stream of `any`; it is bytes.
    const reader = (body as ReadableStream<Uint8Array>).getReader();
    return {
      next: async () => {
        const { done, value } = await reader.read();
        return done ? undefined : value;
      },
      close: () => void reader.cancel().catch(() => undefined),
    };
  }

  /**
   * A local regular file. Anything else is refused before a byte is read: a FIFO (its open waits
   * for a writer, and a writer that closes at once makes an empty binary), a device (/dev/zero
   * never ends; opening some acts on them), a directory.
   */
  private async fileSource(url: URL): Promise<ChunkSource> {
    let path: string;
    try {
      path = fileURLToPath(url);
    } catch (error) {
      throw new ComponentInstallError(`invalid file url: ${errorMessage(error)}`, { cause: error });
    }
    const unreadable = (error: unknown): ComponentInstallError =>
      new ComponentInstallError(`cannot read ${path}: ${errorMessage(error)}`, { cause: error });
    const kind = await stat(path).catch((error: unknown) => {
      throw unreadable(error);
    });
    if (!kind.isFile()) throw new ComponentInstallError(`${path} is not a regular file (${fileKind(kind)})`);
    // The path may have been replaced since: O_NONBLOCK keeps the open of a FIFO from waiting for
    // a writer, O_NOCTTY a terminal from becoming ours, and the fstat of what was opened decides.
    const handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY).catch(
      (error: unknown) => {
        throw unreadable(error);
      },
    );
    const opened = await handle.stat().catch(async (error: unknown) => {
      await handle.close();
      throw unreadable(error);
    });
    if (!opened.isFile()) {
      await handle.close();
      throw new ComponentInstallError(`${path} is not a regular file (${fileKind(opened)})`);
    }
    return fileChunks(handle);
  }

  /** Checks the slot's binary in place, unless an install started or ended meanwhile. */
  private async check(slot: ComponentSlot): Promise<void> {
    const generation = slot.generation;
    const seen = await this.probe(slot.name, slot.path);
    if (slot.generation !== generation) return;
    this.apply(slot, seen);
  }

  private apply(slot: ComponentSlot, seen: Observation): void {
    slot.status = seen.status;
    slot.version = seen.version;
    slot.buildId = seen.buildId;
  }

  /**
   * Looks at a binary: missing, this component's (its `--version` printed its version line, under
   * one 10 s deadline with the build id's step), or something else. Never throws.
   */
  private async probe(name: ComponentName, path: string): Promise<Observation> {
    try {
      await stat(path);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return NOT_INSTALLED;
      return { status: "error", version: "", problem: `cannot stat it: ${errorMessage(error)}` };
    }
    const bound = OperationBound.within(VERSION_TIMEOUT_MS);
    const ran = await this.run([path, "--version"], bound);
    if ("problem" in ran) return { status: "error", version: "", problem: `--version: ${ran.problem}` };
    const line = ran.stdout.trim();
    const match = VERSION_LINE.exec(line);
    const [, binaryName = "", version = ""] = match ?? [];
    if (!match) {
      return {
        status: "error",
        version: "",
        problem: `--version printed ${JSON.stringify(line.slice(0, 120))}`,
      };
    }
    if (!BINARY_NAMES[name].includes(binaryName)) {
      return { status: "error", version: "", problem: `it is ${binaryName} (--version printed "${line}")` };
    }
    // Only a taskshim is asked: a Go dstack-shim has no `version` command, and given unknown
    // arguments it would start serving.
    const buildId = binaryName === "taskshim" ? await this.buildId(path, bound) : undefined;
    return { status: "installed", version, ...(buildId !== undefined ? { buildId } : {}) };
  }

  /** The `build_id` of `<binary> version --json`; undefined when it fails or has none (older releases). */
  private async buildId(path: string, bound: OperationBound): Promise<string | undefined> {
    const ran = await this.run([path, "version", "--json"], bound);
    if ("problem" in ran) return undefined;
    try {
      const parsed: unknown = JSON.parse(ran.stdout);
      if (typeof parsed !== "object" || parsed === null || !("build_id" in parsed)) return undefined;
      const id = parsed.build_id;
      return typeof id === "string" && BUILD_ID.test(id) ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /** Runs a check command under `bound`: its stdout when it exited 0, else what went wrong. */
  private async run(
    argv: readonly string[],
    bound: OperationBound,
  ): Promise<{ readonly stdout: string } | { readonly problem: string }> {
    try {
      const outcome = await this.commands.run({ argv, bound });
      switch (outcome.kind) {
        case "exited":
          if (outcome.code === 0) return { stdout: outcome.stdout.toString("utf8") };
          return {
            problem:
              outcome.code === null
                ? `killed by ${outcome.signal ?? "a signal"}`
                : `exit status ${outcome.code}`,
          };
        case "expired":
          return { problem: `did not finish within ${VERSION_TIMEOUT_MS} ms` };
        case "interrupted":
          return { problem: "interrupted by shutdown" };
      }
    } catch (error) {
      return { problem: errorMessage(error) };
    }
  }
}

/** Reads an open regular file to its end, one chunk at a time. */
function fileChunks(handle: FileHandle): ChunkSource {
  return {
    next: async () => {
      const buffer = Buffer.allocUnsafe(READ_CHUNK_BYTES);
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
      return bytesRead === 0 ? undefined : buffer.subarray(0, bytesRead);
    },
    // A read still stuck in the kernel keeps the handle until it returns; Node closes it then.
    close: () => void handle.close().catch(() => undefined),
  };
}

/** Whether a file starts as an ELF executable (`\x7fELF`) or a script (`#!`) does. */
async function isExecutableFormat(path: string): Promise<boolean> {
  const handle = await open(path, "r");
  try {
    const head = Buffer.alloc(4);
    const { bytesRead } = await handle.read(head, 0, head.length, 0);
    const start = head.subarray(0, bytesRead);
    return start.equals(ELF_MAGIC) || start.subarray(0, 2).toString("latin1") === "#!";
  } finally {
    await handle.close();
  }
}

/** What a non-regular file is, for the refusal's message. */
function fileKind(stats: Stats): string {
  if (stats.isFIFO()) return "a FIFO";
  if (stats.isCharacterDevice()) return "a character device";
  if (stats.isBlockDevice()) return "a block device";
  if (stats.isDirectory()) return "a directory";
  if (stats.isSocket()) return "a socket";
  return "not a file";
}

/**
 * `work`, or the signal's abort as soon as it comes: the caller stops waiting for an operation
 * that may never settle (the operation itself is left to settle on its own).
 */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => undefined);
    return Promise.reject(signal.reason as Error);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    work.finally(() => signal.removeEventListener("abort", onAbort)).then(resolve, reject);
  });
}
