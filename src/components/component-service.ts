import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { logExpected } from "../logging/log-fields.js";
import { BinaryProbe, type Observation } from "./binary-probe.js";
import { ComponentInstaller, type InstallEnd } from "./component-install.js";
import { COMPONENT_SOURCES_FILE, ComponentSources } from "./component-sources.js";
import type { FileIdentity } from "./file-identity.js";
import { redactUrl, redactUrlsIn } from "./redact-url.js";
import { BUILD, VERSION } from "../version.js";

export { ComponentInstallError, ComponentRefusedError } from "./component-errors.js";

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
   * taskshim extension: why the last install of this component failed or was refused (the status
   * and version then describe the binary still in place). Cleared when the next install starts.
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

/** Tuning of a {@link ComponentService}; the defaults are the shim's. */
export interface ComponentServiceOptions {
  /** The deadline of one download, http(s) or file (default 10 min). */
  readonly downloadTimeoutMs?: number;
  /**
   * The shim's home: where each component was last fetched from is kept in
   * `<home>/component-sources.json`, so a restart does not cost a full download. Without it, in
   * memory only.
   */
  readonly home?: string;
  /**
   * Let a `dstack-shim` install replace taskshim with a binary that is not taskshim (dstack's
   * Go shim). Off: such a download is refused and the binary in place keeps serving.
   */
  readonly allowShimHandover?: boolean;
  /**
   * The build id of the shim process itself (default: this build's; `dev` unbundled, which no
   * binary reports). A dstack-shim download that reports it is the build that runs already:
   * nothing is installed, so an upgrade that reads the component then finds the shim current
   * with the bytes it runs on disk, never a binary that only claims to be it.
   */
  readonly runningBuildId?: string;
  /**
   * The identity of the executable this process runs from, where it is known exactly (the single
   * binary's `/proc/self/exe`): a dstack-shim slot holding that very file is reported as this
   * build (this version and `runningBuildId`) without running it.
   */
  readonly runningExecutable?: () => Promise<FileIdentity | undefined>;
}

const DOWNLOAD_TIMEOUT_MS = 10 * 60 * 1000;
interface ComponentSlot {
  readonly name: ComponentName;
  readonly path: string;
  status: ComponentStatus;
  version: string;
  buildId: string | undefined;
  /** The file the status and version were observed on: while it is unchanged, they hold. */
  identity: FileIdentity | undefined;
  /** The last install's failure, until the next install starts. */
  error: string | undefined;
  /** The last verdict logged at info or above: the same one again is logged at debug. */
  announced: string | undefined;
  /**
   * Bumped when an install starts and when it ends. A version check writes its result only if
   * the generation is still the one it began under: an install that started meanwhile owns the
   * slot, and the binary the check ran may since have been replaced.
   */
  generation: number;
}

/**
 * The dstack-runner and dstack-shim binaries on this host: their versions, and background installs.
 * The service owns a slot per component: it checks versions, accepts one install at a time per
 * component, and applies and logs what the install decided. The install itself (download, verify,
 * rename over the target) is {@link ComponentInstaller}'s; anything but a verified binary leaves
 * the target as it was, and the slot reports what is there.
 *
 * The same bytes at the same URL cost at most a conditional request: each component remembers
 * (in the home, across restarts) the validators of the URL it last fetched, the sha256 of the
 * bytes and the verdict on them; a `304` ends the install with the slot as it is, and a `200`
 * whose bytes are the binary in place renames nothing. A dstack-shim download that is not
 * taskshim is refused unless `allowShimHandover`.
 */
export class ComponentService {
  private readonly slots: Record<ComponentName, ComponentSlot>;
  private readonly installs = new Set<Promise<void>>();
  private checked: Promise<void> = Promise.resolve();
  private readonly binaries: BinaryProbe;
  private readonly installer: ComponentInstaller;

  constructor(
    paths: { runner: string; shim: string },
    commands: CommandRunner,
    private readonly log: Logger,
    shutdown: AbortSignal,
    options: ComponentServiceOptions = {},
  ) {
    const slot = (name: ComponentName, path: string): ComponentSlot => ({
      name,
      path,
      status: "not-installed",
      version: "",
      buildId: undefined,
      identity: undefined,
      error: undefined,
      announced: undefined,
      generation: 0,
    });
    this.slots = {
      "dstack-runner": slot("dstack-runner", paths.runner),
      "dstack-shim": slot("dstack-shim", paths.shim),
    };
    const runningBuildId = options.runningBuildId ?? BUILD.buildId;
    const { runningExecutable } = options;
    this.binaries = new BinaryProbe(
      commands,
      runningExecutable && { identity: runningExecutable, version: VERSION, buildId: runningBuildId },
    );
    this.installer = new ComponentInstaller({
      binaries: this.binaries,
      sources: new ComponentSources(
        options.home !== undefined ? join(options.home, COMPONENT_SOURCES_FILE) : undefined,
        log,
      ),
      shutdown,
      downloadTimeoutMs: options.downloadTimeoutMs ?? DOWNLOAD_TIMEOUT_MS,
      allowShimHandover: options.allowShimHandover ?? false,
      runningBuildId,
    });
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

  /**
   * Validates a request and starts the install in the background. Every accepted request starts
   * one (there is no "already installed" answer): the install itself asks the source whether
   * its bytes changed, which is cheap when they did not.
   */
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
    const before: Observation = {
      status: slot.status,
      version: slot.version,
      ...(slot.buildId !== undefined ? { buildId: slot.buildId } : {}),
      ...(slot.identity !== undefined ? { identity: slot.identity } : {}),
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
      before,
    )
      .catch((error: unknown) => {
        // runInstall handles every failure of the install; this is a bug's last resort, so the
        // slot never stays "installing" (which would answer every later install 409).
        slot.generation += 1;
        slot.status = "error";
        slot.identity = undefined;
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
   * One install from start to end: the slot then reports what is at the target (the new binary,
   * or the one in place), a refusal or failure in `error`, and the log says what happened.
   */
  private async runInstall(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    before: Observation,
  ): Promise<void> {
    const end = await this.installer.install(slot, url, sha256, before);
    // The install ends: a check that began during it ran a binary that may be gone.
    slot.generation += 1;
    this.apply(slot, end.seen);
    this.report(slot, url, end);
  }

  /** Logs how an install ended, and sets the slot's `error`. */
  private report(slot: ComponentSlot, url: URL, end: InstallEnd): void {
    const fields = { component: slot.name, url: redactUrl(url.href) };
    const inPlace = { in_place: { status: end.seen.status, version: end.seen.version } };
    switch (end.kind) {
      case "installed":
        slot.announced = undefined;
        this.log.info(
          {
            component: slot.name,
            version: end.seen.version,
            ...(end.seen.buildId ? { build_id: end.seen.buildId } : {}),
          },
          "component installed",
        );
        return;
      case "unchanged":
        // A dstack server posts this install at every instance check: one line per check would
        // drown the log. The first time a download is found to be the binary in place is news.
        if (end.why !== "not-modified" && slot.announced !== `${end.why}:${fields.url}`) {
          slot.announced = `${end.why}:${fields.url}`;
          this.log.info(
            { ...fields, version: end.seen.version },
            end.why === "same-bytes"
              ? "component download is the binary in place; kept"
              : "component download is the build that runs; nothing installed",
          );
        } else {
          this.log.debug(
            { ...fields, version: end.seen.version, why: end.why },
            "component unchanged at its source",
          );
        }
        return;
      case "refused": {
        slot.error = end.refusal.message;
        const identity = end.refusal.rule === "identity";
        const message = identity ? "component install refused" : "component install failed";
        if (slot.announced === end.verdictKey) {
          this.log.debug({ ...fields, ...inPlace, error: end.refusal.message }, `${message} (again)`);
          return;
        }
        slot.announced = end.verdictKey;
        logExpected(this.log, identity ? "warn" : "error", { ...fields, ...inPlace }, end.refusal, message);
        return;
      }
      case "failed":
        slot.error = redactUrlsIn(errorMessage(end.error));
        logExpected(this.log, "error", { ...fields, ...inPlace }, end.error, "component install failed");
        return;
    }
  }

  /** Checks the slot's binary in place, unless an install started or ended meanwhile. */
  private async check(slot: ComponentSlot): Promise<void> {
    const generation = slot.generation;
    const seen = await this.binaries.probe(slot.name, slot.path);
    if (slot.generation !== generation) return;
    this.apply(slot, seen);
  }

  private apply(slot: ComponentSlot, seen: Observation): void {
    slot.status = seen.status;
    slot.version = seen.version;
    slot.buildId = seen.buildId;
    slot.identity = seen.identity;
  }
}
