/*
 * Which engine the shim drives, read from the engine's own `GET /version` answer, and kept
 * current: detected once the engine first answers, and again whenever it comes back after an
 * outage (Docker can be stopped and Podman started on the same socket, or the other way round).
 */

/**
 * The engines the shim tells apart. There are two because the shim has two behaviours: Podman
 * (its GPUs go through CDI) and everything else, spoken to as the Docker Engine API it offers.
 */
export type EngineKind = "docker" | "podman";

/** The engine as its `/version` answer names it. */
export interface EngineInfo {
  readonly kind: EngineKind;
  /** The engine's own version (`20.10.24+dfsg1`, `4.3.1`); `unknown` if the answer has none. */
  readonly version: string;
  /** The Docker Engine API version it serves (`1.41`), when it says. */
  readonly apiVersion?: string;
}

/** One reading of `/version`: the engine, and whether the answer looked like a known engine. */
export interface EngineDetection {
  readonly info: EngineInfo;
  /**
   * false when the answer named neither Podman nor Docker's `Engine` component (some other
   * engine behind the Docker API): it is then treated as Docker, and the caller says so once.
   */
  readonly recognized: boolean;
}

/** Where an engine's version answer comes from (the Engine API adapter, under its deadline). */
export interface EngineVersionSource {
  detectEngine(signal?: AbortSignal): Promise<EngineDetection>;
}

/** Podman's component name in its `/version` answer (Docker's is `Engine`). */
const PODMAN_COMPONENT = "Podman Engine";
const DOCKER_COMPONENT = "Engine";

interface VersionComponent {
  readonly Name?: unknown;
  readonly Version?: unknown;
}

const text = (value: unknown): string | undefined =>
  typeof value === "string" && value.trim() !== "" ? value.trim() : undefined;

/**
 * Reads an engine's `GET /version` answer. Podman lists a `Podman Engine` component (beside
 * Conmon and its OCI runtime) and also fills the top-level Docker fields, so it is looked for
 * first; Docker lists `Engine` (older daemons only the top-level `Version`).
 */
export function parseEngineVersion(body: unknown): EngineDetection {
  const answer = (typeof body === "object" && body !== null ? body : {}) as {
    Components?: unknown;
    Version?: unknown;
    ApiVersion?: unknown;
  };
  const components: VersionComponent[] = Array.isArray(answer.Components)
    ? (answer.Components as unknown[]).filter(
        (c): c is VersionComponent => typeof c === "object" && c !== null,
      )
    : [];
  const named = (name: string): VersionComponent | undefined => components.find((c) => c.Name === name);
  const apiVersion = text(answer.ApiVersion);
  const withApi = (info: Omit<EngineInfo, "apiVersion">): EngineInfo =>
    apiVersion === undefined ? info : { ...info, apiVersion };
  const podman = named(PODMAN_COMPONENT);
  if (podman !== undefined) {
    const version = text(podman.Version) ?? text(answer.Version) ?? "unknown";
    return { info: withApi({ kind: "podman", version }), recognized: true };
  }
  const engine = named(DOCKER_COMPONENT);
  const version = text(engine?.Version) ?? text(answer.Version);
  return {
    info: withApi({ kind: "docker", version: version ?? "unknown" }),
    recognized: engine !== undefined || (components.length === 0 && version !== undefined),
  };
}

/** `4.3.1`, `5.5.0-rc1`, `20.10.24+dfsg1` → [major, minor, patch]; undefined without a number. */
export function versionNumbers(version: string): [number, number, number] | undefined {
  const match = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(version.trim());
  if (!match) return undefined;
  return [Number(match[1]), Number(match[2] ?? 0), Number(match[3] ?? 0)];
}

/** Whether `version` is at least `min` (false when it has no number to compare). */
export function versionAtLeast(version: string, min: readonly [number, number, number]): boolean {
  const have = versionNumbers(version);
  if (have === undefined) return false;
  for (let i = 0; i < 3; i++) {
    const [a, b] = [have[i] ?? 0, min[i] ?? 0];
    if (a !== b) return a > b;
  }
  return true;
}

/** While no detection has succeeded, an engine that is up is asked again at most this often. */
export const ENGINE_REDETECT_MS = 30_000;

/** How {@link EngineIdentity} reports. */
export interface EngineIdentityHooks {
  /** One line for the operator (a new engine, an unrecognized one, a failed detection). */
  readonly log: (level: "info" | "warn", fields: Record<string, unknown>, msg: string) => void;
  /** Called with each newly detected engine (the metric's labels follow it). */
  readonly changed?: (info: EngineInfo) => void;
  /** The monotonic clock (ms) of the re-detection rate limit; tests pass their own. */
  readonly now?: () => number;
}

/**
 * The engine the shim drives, as last detected. `detect` runs after the first successful ping;
 * `seen` is told each time the reconciler finds the engine up or down, and detects again when
 * it comes back after being down (or, while none succeeded yet, every {@link ENGINE_REDETECT_MS}).
 * A failed detection keeps what was known and never throws: the engine's name is reported, it
 * decides nothing about task state.
 */
export class EngineIdentity {
  private info: EngineInfo | undefined;
  private wasDown = false;
  private failing = false;
  private lastAttemptAt = Number.NEGATIVE_INFINITY;
  private inFlight: Promise<EngineInfo | undefined> | undefined;
  private readonly now: () => number;

  constructor(
    private readonly source: EngineVersionSource,
    private readonly hooks: EngineIdentityHooks,
  ) {
    this.now = hooks.now ?? (() => performance.now());
  }

  /** The engine as last detected; undefined before the first detection succeeded. */
  current(): EngineInfo | undefined {
    return this.info;
  }

  /** Asks the engine which it is (one request at a time; a second caller shares the first's). */
  detect(signal?: AbortSignal): Promise<EngineInfo | undefined> {
    this.inFlight ??= this.read(signal).finally(() => (this.inFlight = undefined));
    return this.inFlight;
  }

  /** The reconciler saw the engine up or down: back after being down, it is detected again. */
  seen(up: boolean, signal?: AbortSignal): void {
    if (!up) {
      this.wasDown = true;
      return;
    }
    const due =
      this.wasDown || (this.info === undefined && this.now() - this.lastAttemptAt >= ENGINE_REDETECT_MS);
    if (!due) return;
    this.wasDown = false;
    void this.detect(signal);
  }

  private async read(signal: AbortSignal | undefined): Promise<EngineInfo | undefined> {
    this.lastAttemptAt = this.now();
    let detection: EngineDetection;
    try {
      detection = await this.source.detectEngine(signal);
    } catch (error) {
      // Said once per failing spell, not at every retry.
      if (!this.failing) {
        this.hooks.log(
          "warn",
          { error: error instanceof Error ? error.message : String(error) },
          "cannot tell which engine this is (GET /version failed); the last one known stays named",
        );
      }
      this.failing = true;
      return this.info;
    }
    this.failing = false;
    const { info, recognized } = detection;
    const before = this.info;
    this.info = info;
    if (before?.kind === info.kind && before.version === info.version) return info;
    if (!recognized) {
      this.hooks.log(
        "warn",
        { engineKind: info.kind, engineVersion: info.version },
        "the engine's /version names neither Docker nor Podman; it is driven as the Docker Engine",
      );
    }
    if (before !== undefined) {
      this.hooks.log(
        "info",
        { engineKind: info.kind, engineVersion: info.version, was: `${before.kind} ${before.version}` },
        "the engine changed",
      );
    }
    this.hooks.changed?.(info);
    return info;
  }
}
