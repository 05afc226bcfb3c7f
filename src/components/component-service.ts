import { createHash } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { chmod, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import type { Logger } from "pino";
import { errorMessage } from "../errors/error-message.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import { logExpected } from "../logging/log-fields.js";
import { syncDirectory } from "../state/durable-write.js";
import { BinaryProbe, isExecutableFormat, NOT_INSTALLED, type Observation } from "./binary-probe.js";
import { ComponentInstallError, ComponentRefusedError } from "./component-errors.js";
import {
  COMPONENT_SOURCES_FILE,
  ComponentSources,
  sourceRecord,
  verdictHolds,
  verdictKey,
  type SourceRecord,
  type SourceVerdict,
} from "./component-sources.js";
import { download, type DownloadResult } from "./download.js";
import { fileIdentity, sameFile, type FileIdentity } from "./file-identity.js";
import { redactUrl, redactUrlsIn } from "./redact-url.js";
import { BUILD } from "../version.js";

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

/** How far an install got: once renamed, the target is the verified download. */
interface InstallProgress {
  renamed?: Observation;
}

/**
 * How an install ended; `seen` is what the slot reports afterwards.
 *
 * - `installed`: new bytes, verified and renamed over the target;
 * - `unchanged`: the source's bytes are the binary in place (a `304` to the conditional request,
 *   or a `200` with the same sha256), or a build that already runs (a dstack-shim reporting the
 *   running build id over a binary in place of that build): nothing renamed;
 * - `refused`: the bytes failed a check that depends on them alone (remembered, see
 *   {@link ComponentRefusedError}); the target is untouched;
 * - `failed`: anything else (the download, a `--version` that could not run, the disk).
 */
type InstallEnd =
  | { readonly kind: "installed"; readonly seen: Observation }
  | {
      readonly kind: "unchanged";
      readonly seen: Observation;
      readonly why: "not-modified" | "same-bytes" | "running-build";
    }
  | {
      readonly kind: "refused";
      readonly seen: Observation;
      readonly refusal: ComponentRefusedError;
      /** The refused URL, bytes and reason: logged once, repeats at debug. */
      readonly verdictKey: string;
    }
  | { readonly kind: "failed"; readonly seen: Observation; readonly error: unknown };

/** What a download fetched: its digest and size, and the validators to ask with next time. */
type Fetched = Extract<DownloadResult, { kind: "fetched" }>;

/**
 * The dstack-runner and dstack-shim binaries on this host: their versions, and background installs.
 * An install downloads to a 0600 temp file beside the target, checks the sha256 when given, runs
 * the temp's `--version` (mode 0700), and only a binary that printed this component's version line
 * is made 0755, renamed over the target (a running process keeps the old inode) and the directory
 * fsynced. Anything else leaves the target as it was, and the slot reports what is there.
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
  private readonly downloadTimeoutMs: number;
  private readonly allowShimHandover: boolean;
  private readonly runningBuildId: string | undefined;
  private readonly sources: ComponentSources;
  private readonly binaries: BinaryProbe;

  constructor(
    paths: { runner: string; shim: string },
    commands: CommandRunner,
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
      identity: undefined,
      error: undefined,
      announced: undefined,
      generation: 0,
    });
    this.slots = {
      "dstack-runner": slot("dstack-runner", paths.runner),
      "dstack-shim": slot("dstack-shim", paths.shim),
    };
    this.downloadTimeoutMs = options.downloadTimeoutMs ?? DOWNLOAD_TIMEOUT_MS;
    this.allowShimHandover = options.allowShimHandover ?? false;
    this.runningBuildId = options.runningBuildId ?? BUILD.buildId;
    this.binaries = new BinaryProbe(commands);
    this.sources = new ComponentSources(
      options.home !== undefined ? join(options.home, COMPONENT_SOURCES_FILE) : undefined,
      log,
    );
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
    const progress: InstallProgress = {};
    let end: InstallEnd;
    try {
      end = await this.installFrom(slot, url, sha256, before, progress);
    } catch (error) {
      end = { kind: "failed", error, seen: await this.inPlaceAfterFailure(slot, progress, before) };
    }
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

  /**
   * Asks the source (conditionally when a remembered verdict on this URL still holds) and decides:
   * unchanged, refused, or verified and renamed over the target. Throws on anything that is no
   * verdict on the bytes (a failed download, a `--version` that could not run, the disk).
   */
  private async installFrom(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    before: Observation,
    progress: InstallProgress,
  ): Promise<InstallEnd> {
    const record = await this.sources.get(slot.name);
    const target = await fileIdentity(slot.path);
    const asked = { url: url.href, sha256, target, allowShimHandover: this.allowShimHandover };
    const known = record !== undefined && verdictHolds(record, asked) ? record : undefined;
    const temp = join(dirname(slot.path), `.${basename(slot.path)}.download-${process.pid}-${Date.now()}`);
    try {
      const got = await download({
        url,
        temp,
        shutdown: this.shutdown,
        timeoutMs: this.downloadTimeoutMs,
        ...(known !== undefined ? { ifChanged: known.validators } : {}),
      });
      if (got.kind === "not-modified") {
        // download() answers not-modified only to a request that carried validators.
        if (known === undefined)
          throw new ComponentInstallError("download failed: HTTP 304 to a plain request");
        return await this.fromVerdict(slot, known, before);
      }
      return await this.judge(slot, url, sha256, got, { record, known, target, before, temp, progress });
    } finally {
      if (!progress.renamed) await unlink(temp).catch(() => undefined);
    }
  }

  /** The source's bytes did not change (`304`): the remembered verdict stands, nothing is run. */
  private async fromVerdict(
    slot: ComponentSlot,
    record: SourceRecord,
    before: Observation,
  ): Promise<InstallEnd> {
    const verdict = record.verdict;
    if (verdict.kind === "installed") {
      // The target is still the file that verdict installed (verdictHolds() checked it).
      const seen: Observation = {
        status: "installed",
        version: verdict.version,
        ...(verdict.buildId !== undefined ? { buildId: verdict.buildId } : {}),
        identity: verdict.target,
      };
      return { kind: "unchanged", why: "not-modified", seen };
    }
    return {
      kind: "refused",
      refusal: new ComponentRefusedError(verdict.rule, verdict.reason),
      seen: await this.inPlace(slot, before),
      verdictKey: verdictKey(record),
    };
  }

  /** New bytes (a `200`): the same as in place, refused, or verified and renamed over the target. */
  private async judge(
    slot: ComponentSlot,
    url: URL,
    sha256: string | undefined,
    got: Fetched,
    at: {
      readonly record: SourceRecord | undefined;
      readonly known: SourceRecord | undefined;
      readonly target: FileIdentity | undefined;
      readonly before: Observation;
      readonly temp: string;
      readonly progress: InstallProgress;
    },
  ): Promise<InstallEnd> {
    const remember = async (verdict: SourceVerdict): Promise<SourceRecord> => {
      const record = sourceRecord(url.href, sha256, got, verdict);
      await this.sources.put(slot.name, record);
      return record;
    };
    try {
      if (sha256 !== undefined && got.sha256 !== sha256) {
        throw new ComponentRefusedError("sha256", `sha256 mismatch: expected ${sha256}, got ${got.sha256}`);
      }
      // A source without validators sends every byte again: bytes refused before are not run again.
      if (at.known?.verdict.kind === "refused" && at.known.sha256 === got.sha256) {
        throw new ComponentRefusedError(at.known.verdict.rule, at.known.verdict.reason);
      }
      // The bytes of the binary in place (dstack's deploy fetched this very file; a source
      // without validators): nothing to replace, and a rename would only change the inode.
      const same = await this.sameAsInPlace(slot, got, at.record, at.target, at.before);
      if (same?.identity !== undefined) {
        await remember({ kind: "installed", target: same.identity, ...installedOf(same) });
        return { kind: "unchanged", why: "same-bytes", seen: same };
      }
      const verified = await this.verify(slot, url, at.temp);
      const running = await this.runningBuild(slot, verified, at.before);
      if (running !== undefined) {
        if (running.identity !== undefined) {
          await remember({ kind: "installed", target: running.identity, ...installedOf(running) });
        }
        return { kind: "unchanged", why: "running-build", seen: running };
      }
      await chmod(at.temp, 0o755);
      await rename(at.temp, slot.path);
      at.progress.renamed = verified;
      await syncDirectory(dirname(slot.path));
      const target = await fileIdentity(slot.path);
      const seen: Observation = { ...verified, ...(target !== undefined ? { identity: target } : {}) };
      at.progress.renamed = seen;
      if (target !== undefined) await remember({ kind: "installed", target, ...installedOf(seen) });
      return { kind: "installed", seen };
    } catch (error) {
      if (!(error instanceof ComponentRefusedError)) throw error;
      const record = await remember({ kind: "refused", rule: error.rule, reason: error.message });
      return {
        kind: "refused",
        refusal: error,
        seen: await this.inPlace(slot, at.before),
        verdictKey: verdictKey(record),
      };
    }
  }

  /**
   * The binary in place when it is an installed binary with the bytes fetched. Its sha256 is the
   * remembered one while the target is the file that was installed, else it is read (once per
   * new download, and only when the sizes match).
   */
  private async sameAsInPlace(
    slot: ComponentSlot,
    got: Fetched,
    record: SourceRecord | undefined,
    target: FileIdentity | undefined,
    before: Observation,
  ): Promise<Observation | undefined> {
    if (target === undefined || target.size !== String(got.size)) return undefined;
    const remembered =
      record?.verdict.kind === "installed" && sameFile(record.verdict.target, target)
        ? record.sha256
        : undefined;
    const inPlace = remembered ?? (await sha256Of(slot.path).catch(() => undefined));
    if (inPlace !== got.sha256) return undefined;
    const seen = await this.inPlace(slot, before);
    return seen.status === "installed" ? seen : undefined;
  }

  /**
   * For a dstack-shim download that reports the build id of this very process: the binary in
   * place, when it is that build too (nothing to install). When the binary in place is another
   * build (installed and not running yet), neither is right to keep silently: the install fails.
   * Undefined for any other download.
   */
  private async runningBuild(
    slot: ComponentSlot,
    verified: Observation,
    before: Observation,
  ): Promise<Observation | undefined> {
    const running = this.runningBuildId;
    if (slot.name !== "dstack-shim" || running === undefined || verified.buildId !== running)
      return undefined;
    const inPlace = await this.inPlace(slot, before);
    if (inPlace.status === "installed" && inPlace.buildId === running) return inPlace;
    throw new ComponentInstallError(
      `the download is the build this shim runs (${verified.version}, build ${running}), but the binary in place is ${inPlace.version || inPlace.status}${inPlace.buildId ? ` (build ${inPlace.buildId})` : ""}: not replaced`,
    );
  }

  /**
   * Checks a download in its temp file: a binary of this component, and for dstack-shim a
   * taskshim unless handover is allowed. Throws a {@link ComponentRefusedError} for what the
   * bytes are, a {@link ComponentInstallError} when its `--version` could not be asked.
   */
  private async verify(slot: ComponentSlot, url: URL, temp: string): Promise<Observation> {
    // Node's spawn, like execvp, hands a file the kernel cannot execute (ENOEXEC) to /bin/sh:
    // an error page or a copied text file would be run as a shell script, as the shim's user.
    if (!(await isExecutableFormat(temp))) {
      throw new ComponentRefusedError(
        "content",
        `the download is not a ${slot.name} binary: neither an ELF executable nor a #! script`,
      );
    }
    // Runnable by its owner alone while unverified: it may be anything (an error page, a copy
    // of a file nobody else may read), and it must not be readable by others meanwhile.
    await chmod(temp, 0o700);
    const seen = await this.binaries.probe(slot.name, temp);
    if (seen.status !== "installed") {
      const message = `the download is not a ${slot.name} binary: ${seen.problem?.message ?? "it reports no version"}`;
      throw seen.problem?.kind === "content"
        ? new ComponentRefusedError("content", message)
        : new ComponentInstallError(message);
    }
    // The running shim is taskshim: a dstack-shim that is not one would take its place at the
    // next restart, and dstack's server restarts it into another product (docs/operations.md).
    if (slot.name === "dstack-shim" && seen.binary !== "taskshim" && !this.allowShimHandover) {
      throw new ComponentRefusedError(
        "identity",
        `refused: ${redactUrl(url.href)} is ${seen.binary ?? "unknown"} ${seen.version}, not taskshim (allow with --allow-shim-handover)`,
      );
    }
    return seen;
  }

  /** What is at the target after a failed install: what is there, not a blanket `error`. */
  private async inPlaceAfterFailure(
    slot: ComponentSlot,
    progress: InstallProgress,
    before: Observation,
  ): Promise<Observation> {
    // Failed after the rename (the directory's fsync): the target is the verified download.
    if (progress.renamed) return progress.renamed;
    return this.inPlace(slot, before);
  }

  /**
   * The binary in place, which the install did not touch: as observed before it while the file
   * is the same (no `--version` run at every check of a dstack server), else checked again.
   */
  private async inPlace(slot: ComponentSlot, before: Observation): Promise<Observation> {
    if (sameFile(before.identity, await fileIdentity(slot.path))) return before;
    // Shutting down: run nothing more. The target was not touched, so it is what it was.
    if (this.shutdown.aborted) return existsSync(slot.path) ? before : NOT_INSTALLED;
    return this.binaries.probe(slot.name, slot.path);
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

/** The sha256 of a file, read in full. */
async function sha256Of(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

/** The version and build id an "installed" verdict remembers. */
function installedOf(seen: Observation): { version: string; buildId?: string } {
  return { version: seen.version, ...(seen.buildId !== undefined ? { buildId: seen.buildId } : {}) };
}
