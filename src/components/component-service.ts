import { createHash } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { chmod, open, rename, stat, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { Readable } from "node:stream";
import type { Logger } from "pino";
import { OperationBound } from "../exec/operation-bound.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { syncDirectory } from "../state/durable-write.js";
import { redactUrl } from "./redact-url.js";
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

const DOWNLOAD_TIMEOUT_MS = 10 * 60 * 1000;
const VERSION_TIMEOUT_MS = 10_000;
/** Output of `<binary> --version`: `<name> version <X>`. */
const VERSION_LINE = /^(dstack-runner|dstack-shim|taskshim) version (\S+)$/;

interface ComponentSlot {
  readonly name: ComponentName;
  readonly path: string;
  status: ComponentStatus;
  version: string;
  /** The URL (and digest) of the last successful install, to skip a repeated one (#3953). */
  installedFrom?: string;
}

/**
 * The dstack-runner and dstack-shim binaries on this host: their versions, and background installs that
 * download to a temp file beside the target, verify, fsync and rename over it (a running
 * process keeps the old inode), then re-check the version.
 */
export class ComponentService {
  private readonly slots: Record<ComponentName, ComponentSlot>;
  private readonly installs = new Set<Promise<void>>();
  private checked: Promise<void> = Promise.resolve();

  constructor(
    paths: { runner: string; shim: string },
    private readonly commands: CommandRunner,
    private readonly log: Logger,
    private readonly shutdown: AbortSignal,
  ) {
    this.slots = {
      "dstack-runner": { name: "dstack-runner", path: paths.runner, status: "not-installed", version: "" },
      "dstack-shim": { name: "dstack-shim", path: paths.shim, status: "not-installed", version: "" },
    };
  }

  /**
   * Checks both binaries' versions (at startup; installs re-check their own). It runs in the
   * background so it does not delay serving; `list()` waits for it, so nobody ever sees a
   * component as "not-installed" only because it was not checked yet.
   */
  refresh(): Promise<void> {
    this.checked = (async () => {
      for (const slot of Object.values(this.slots)) if (slot.status !== "installing") await this.check(slot);
    })();
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
    return [this.slots["dstack-runner"], this.slots["dstack-shim"]].map(({ name, version, status }) => ({
      name,
      version,
      status,
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
    slot.status = "installing";
    slot.version = "";
    const job = this.runInstall(
      slot,
      parsed,
      typeof sha256 === "string" ? sha256.toLowerCase() : undefined,
      source,
    )
      .catch((error: unknown) => {
        slot.status = "error";
        logExpected(
          this.log,
          "error",
          { component: name, url: redactUrl(url) },
          error,
          "component install failed",
        );
      })
      .finally(() => this.installs.delete(job));
    this.installs.add(job);
  }

  /** Waits for background installs (shutdown). */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.installs]);
  }

  private async runInstall(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    source: string,
  ): Promise<void> {
    const dir = dirname(slot.path);
    const temp = join(dir, `.${basename(slot.path)}.download-${process.pid}-${Date.now()}`);
    try {
      const digest = await this.download(url, temp);
      if (sha256 !== undefined && digest !== sha256) {
        throw new Error(`sha256 mismatch: expected ${sha256}, got ${digest}`);
      }
      await chmod(temp, 0o755);
      await rename(temp, slot.path);
      await syncDirectory(dir);
    } finally {
      await unlink(temp).catch(() => undefined);
    }
    await this.check(slot);
    if (slot.status !== "installed") throw new Error(`installed binary does not report a version`);
    slot.installedFrom = source;
    this.log.info({ component: slot.name, version: slot.version }, "component installed");
  }

  private async download(url: URL, temp: string): Promise<string> {
    const hash = createHash("sha256");
    // The temp file first: a source opened before a failure here would have no reader, and a
    // read stream's own error (a missing file: URL) would then be an uncaught exception.
    const file = await open(temp, "wx", 0o600);
    try {
      for await (const chunk of await this.source(url)) {
        if (this.shutdown.aborted) throw new Error("shim shutting down");
        hash.update(chunk as Buffer);
        await file.write(chunk as Buffer);
      }
      await file.sync();
    } finally {
      await file.close();
    }
    return hash.digest("hex");
  }

  /** The download's body: a local file, or an HTTP(S) answer (under the download deadline). */
  private async source(url: URL): Promise<Readable> {
    if (url.protocol === "file:") return createReadStream(url);
    const response = await fetch(url, {
      signal: AbortSignal.timeout(DOWNLOAD_TIMEOUT_MS),
      redirect: "follow",
    });
    if (response.status !== 200 || !response.body)
      throw new Error(`download failed: HTTP ${response.status}`);
    return Readable.fromWeb(response.body as import("node:stream/web").ReadableStream<Uint8Array>);
  }

  private async check(slot: ComponentSlot): Promise<void> {
    try {
      await stat(slot.path);
    } catch {
      slot.status = "not-installed";
      slot.version = "";
      return;
    }
    try {
      const outcome = await this.commands.run({
        argv: [slot.path, "--version"],
        bound: OperationBound.within(VERSION_TIMEOUT_MS),
      });
      const line =
        outcome.kind === "exited" && outcome.code === 0 ? outcome.stdout.toString("utf8").trim() : "";
      const match = VERSION_LINE.exec(line);
      slot.status = match ? "installed" : "error";
      slot.version = match?.[2] ?? "";
    } catch {
      slot.status = "error";
      slot.version = "";
    }
  }
}
