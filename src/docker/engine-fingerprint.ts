/*
 * Which engine instance a home's containers live on. Kind and version (engine-info.ts) name an
 * engine; they cannot tell two Docker daemons apart, nor Docker from a Podman later served on the
 * same socket. A fingerprint can: Docker's `GET /info` `ID` (persisted by the daemon across its
 * restarts), and for Podman, whose compatible `/info` answers a new random `ID` at every request,
 * its graph root (`DockerRootDir`), which is where its containers are.
 */
import type { EngineKind } from "./engine-info.js";

/** One engine instance as its own answers identify it. */
export interface EngineFingerprint {
  readonly kind: EngineKind;
  /** Docker's daemon `ID`; `""` for Podman (not stable: see the file's comment). */
  readonly id: string;
  /** `DockerRootDir`: where the engine keeps images and containers. */
  readonly rootDir: string;
}

/** What reads an engine's fingerprint (the Engine API adapter, under its deadline). */
export interface EngineFingerprintSource {
  fingerprint(signal?: AbortSignal): Promise<EngineFingerprint>;
}

/** An engine answer without what a fingerprint needs. */
export class EngineFingerprintError extends Error {
  override readonly name = "EngineFingerprintError";
}

/**
 * Reads a fingerprint from a `GET /info` answer of an engine of `kind`.
 *
 * @throws EngineFingerprintError when the answer has no absolute `DockerRootDir`, or Docker's no `ID`.
 */
export function fingerprintOf(kind: EngineKind, info: unknown): EngineFingerprint {
  const { ID, DockerRootDir } = (typeof info === "object" && info !== null ? info : {}) as {
    ID?: unknown;
    DockerRootDir?: unknown;
  };
  if (typeof DockerRootDir !== "string" || !DockerRootDir.startsWith("/")) {
    throw new EngineFingerprintError(
      `the engine's /info has no DockerRootDir (got ${JSON.stringify(DockerRootDir)})`,
    );
  }
  if (kind === "podman") return { kind, id: "", rootDir: DockerRootDir };
  if (typeof ID !== "string" || ID.trim() === "") {
    throw new EngineFingerprintError(`the engine's /info has no ID (got ${JSON.stringify(ID)})`);
  }
  return { kind, id: ID.trim(), rootDir: DockerRootDir };
}

/** Whether two fingerprints are the same engine instance. */
export function sameEngine(a: EngineFingerprint, b: EngineFingerprint): boolean {
  if (a.kind !== b.kind || a.rootDir !== b.rootDir) return false;
  return a.kind === "podman" || a.id === b.id;
}

/** `docker 2XPC:EZGC:… (/var/lib/docker)`, `podman (/var/lib/containers/storage)`: for one log line. */
export function describeEngine(fingerprint: EngineFingerprint): string {
  const id = fingerprint.id === "" ? "" : ` ${fingerprint.id}`;
  return `${fingerprint.kind}${id} (${fingerprint.rootDir})`;
}
