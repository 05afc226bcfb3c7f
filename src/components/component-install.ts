import { createHash } from "node:crypto";
import { createReadStream, existsSync } from "node:fs";
import { chmod, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { syncDirectory } from "../state/durable-write.js";
import { isExecutableFormat, NOT_INSTALLED, type BinaryProbe, type Observation } from "./binary-probe.js";
import { ComponentInstallError, ComponentRefusedError } from "./component-errors.js";
import type { ComponentName } from "./component-service.js";
import {
  sourceRecord,
  verdictHolds,
  verdictKey,
  type ComponentSources,
  type SourceRecord,
  type SourceVerdict,
} from "./component-sources.js";
import { download, type DownloadResult } from "./download.js";
import { fileIdentity, sameFile, type FileIdentity } from "./file-identity.js";
import { redactUrl } from "./redact-url.js";

/*
 * The install pipeline of one component: download (conditional on the verdict last remembered
 * for the URL) → verify (the sha256, an ELF or #! file, this component's version line; a `file:`
 * source must be a regular file) → install atomically (0755, renamed over the target, the
 * directory fsynced). It decides how an install ended; the service (component-service.ts) owns
 * the slots, applies that end and logs it.
 */

/** The component an install writes: its name, and the path of its binary. */
export interface InstallTarget {
  readonly name: ComponentName;
  readonly path: string;
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
export type InstallEnd =
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

/** What the pipeline needs: where it remembers sources, how it runs `--version`, its settings. */
export interface InstallerDeps {
  readonly sources: ComponentSources;
  readonly binaries: BinaryProbe;
  /** Aborts downloads, and stops running anything more, when the shim shuts down. */
  readonly shutdown: AbortSignal;
  /** The deadline of one download, http(s) or file. */
  readonly downloadTimeoutMs: number;
  /** Let a `dstack-shim` install replace taskshim with a binary that is not taskshim. */
  readonly allowShimHandover: boolean;
  /** The build id of the shim process itself, if it has one. */
  readonly runningBuildId: string | undefined;
}

/**
 * Downloads, verifies and installs one component's binary. An install downloads to a 0600 temp
 * file beside the target, checks the sha256 when given, runs the temp's `--version` (mode 0700),
 * and only a binary that printed this component's version line is made 0755, renamed over the
 * target (a running process keeps the old inode) and the directory fsynced. Anything else leaves
 * the target as it was, and the end says what is there.
 */
export class ComponentInstaller {
  private readonly sources: ComponentSources;
  private readonly binaries: BinaryProbe;
  private readonly shutdown: AbortSignal;
  private readonly downloadTimeoutMs: number;
  private readonly allowShimHandover: boolean;
  private readonly runningBuildId: string | undefined;

  constructor(deps: InstallerDeps) {
    this.sources = deps.sources;
    this.binaries = deps.binaries;
    this.shutdown = deps.shutdown;
    this.downloadTimeoutMs = deps.downloadTimeoutMs;
    this.allowShimHandover = deps.allowShimHandover;
    this.runningBuildId = deps.runningBuildId;
  }

  /**
   * One install from start to end: never rejects for what the install met (that is a `failed`
   * end), and `seen` is what is at the target afterwards (the new binary, or the one in place).
   * `before` is what the slot reported when the install started.
   */
  async install(
    component: InstallTarget,
    url: URL,
    sha256: string | undefined,
    before: Observation,
  ): Promise<InstallEnd> {
    const progress: InstallProgress = {};
    try {
      return await this.installFrom(component, url, sha256, before, progress);
    } catch (error) {
      return { kind: "failed", error, seen: await this.inPlaceAfterFailure(component, progress, before) };
    }
  }

  /**
   * Asks the source (conditionally when a remembered verdict on this URL still holds) and decides:
   * unchanged, refused, or verified and renamed over the target. Throws on anything that is no
   * verdict on the bytes (a failed download, a `--version` that could not run, the disk).
   */
  private async installFrom(
    component: InstallTarget,
    url: URL,
    sha256: string | undefined,
    before: Observation,
    progress: InstallProgress,
  ): Promise<InstallEnd> {
    const record = await this.sources.get(component.name);
    const target = await fileIdentity(component.path);
    const asked = { url: url.href, sha256, target, allowShimHandover: this.allowShimHandover };
    const known = record !== undefined && verdictHolds(record, asked) ? record : undefined;
    const temp = join(
      dirname(component.path),
      `.${basename(component.path)}.download-${process.pid}-${Date.now()}`,
    );
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
        return await this.fromVerdict(component, known, before);
      }
      return await this.judge(component, url, sha256, got, { record, known, target, before, temp, progress });
    } finally {
      if (!progress.renamed) await unlink(temp).catch(() => undefined);
    }
  }

  /** The source's bytes did not change (`304`): the remembered verdict stands, nothing is run. */
  private async fromVerdict(
    component: InstallTarget,
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
      seen: await this.inPlace(component, before),
      verdictKey: verdictKey(record),
    };
  }

  /** New bytes (a `200`): the same as in place, refused, or verified and renamed over the target. */
  private async judge(
    component: InstallTarget,
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
      await this.sources.put(component.name, record);
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
      const same = await this.sameAsInPlace(component, got, at.record, at.target, at.before);
      if (same?.identity !== undefined) {
        await remember({ kind: "installed", target: same.identity, ...installedOf(same) });
        return { kind: "unchanged", why: "same-bytes", seen: same };
      }
      const verified = await this.verify(component, url, at.temp);
      const running = await this.runningBuild(component, verified, at.before);
      if (running !== undefined) {
        if (running.identity !== undefined) {
          await remember({ kind: "installed", target: running.identity, ...installedOf(running) });
        }
        return { kind: "unchanged", why: "running-build", seen: running };
      }
      await chmod(at.temp, 0o755);
      await rename(at.temp, component.path);
      at.progress.renamed = verified;
      await syncDirectory(dirname(component.path));
      const target = await fileIdentity(component.path);
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
        seen: await this.inPlace(component, at.before),
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
    component: InstallTarget,
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
    const inPlace = remembered ?? (await sha256Of(component.path).catch(() => undefined));
    if (inPlace !== got.sha256) return undefined;
    const seen = await this.inPlace(component, before);
    return seen.status === "installed" ? seen : undefined;
  }

  /**
   * For a dstack-shim download that reports the build id of this very process: the binary in
   * place, when it is that build too (nothing to install). When the binary in place is another
   * build (installed and not running yet), neither is right to keep silently: the install fails.
   * Undefined for any other download.
   */
  private async runningBuild(
    component: InstallTarget,
    verified: Observation,
    before: Observation,
  ): Promise<Observation | undefined> {
    const running = this.runningBuildId;
    if (component.name !== "dstack-shim" || running === undefined || verified.buildId !== running)
      return undefined;
    const inPlace = await this.inPlace(component, before);
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
  private async verify(component: InstallTarget, url: URL, temp: string): Promise<Observation> {
    // Node's spawn, like execvp, hands a file the kernel cannot execute (ENOEXEC) to /bin/sh:
    // an error page or a copied text file would be run as a shell script, as the shim's user.
    if (!(await isExecutableFormat(temp))) {
      throw new ComponentRefusedError(
        "content",
        `the download is not a ${component.name} binary: neither an ELF executable nor a #! script`,
      );
    }
    // Runnable by its owner alone while unverified: it may be anything (an error page, a copy
    // of a file nobody else may read), and it must not be readable by others meanwhile.
    await chmod(temp, 0o700);
    const seen = await this.binaries.probe(component.name, temp);
    if (seen.status !== "installed") {
      const message = `the download is not a ${component.name} binary: ${seen.problem?.message ?? "it reports no version"}`;
      throw seen.problem?.kind === "content"
        ? new ComponentRefusedError("content", message)
        : new ComponentInstallError(message);
    }
    // The running shim is taskshim: a dstack-shim that is not one would take its place at the
    // next restart, and dstack's server restarts it into another product (docs/operations.md).
    if (component.name === "dstack-shim" && seen.binary !== "taskshim" && !this.allowShimHandover) {
      throw new ComponentRefusedError(
        "identity",
        `refused: ${redactUrl(url.href)} is ${seen.binary ?? "unknown"} ${seen.version}, not taskshim (allow with --allow-shim-handover)`,
      );
    }
    return seen;
  }

  /** What is at the target after a failed install: what is there, not a blanket `error`. */
  private async inPlaceAfterFailure(
    component: InstallTarget,
    progress: InstallProgress,
    before: Observation,
  ): Promise<Observation> {
    // Failed after the rename (the directory's fsync): the target is the verified download.
    if (progress.renamed) return progress.renamed;
    return this.inPlace(component, before);
  }

  /**
   * The binary in place, which the install did not touch: as observed before it while the file
   * is the same (no `--version` run at every check of a dstack server), else checked again.
   */
  private async inPlace(component: InstallTarget, before: Observation): Promise<Observation> {
    if (sameFile(before.identity, await fileIdentity(component.path))) return before;
    // Shutting down: run nothing more. The target was not touched, so it is what it was.
    if (this.shutdown.aborted) return existsSync(component.path) ? before : NOT_INSTALLED;
    return this.binaries.probe(component.name, component.path);
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
