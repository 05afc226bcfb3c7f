import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import type Docker from "dockerode";
import { isPodman, testDocker } from "../../test/support/docker.js";

/** The engines the benchmarks run on (`--engines docker,podman`). */
export const ENGINE_KINDS = ["docker", "podman"] as const;
export type EngineKind = (typeof ENGINE_KINDS)[number];

/** The rootful Podman service `scripts/ensure-engine.mjs --engine podman` starts. */
export const PODMAN_DEFAULT_URL = "unix:///run/taskshim-podman/podman.sock";

/** The benchmarks that also run on engines other than Docker (B3–B10 are Docker only). */
export const PER_ENGINE: ReadonlySet<string> = new Set(["B1", "B2"]);

/** One engine a run measures: its kind, where it is, and the bench's client for it. */
export interface EngineTarget {
  readonly kind: EngineKind;
  /**
   * A `DOCKER_HOST`-style URL the bench's shims are pointed at (`TASKSHIM_ENGINE_URL`), or
   * undefined for Docker found as the shim finds it by default (`DOCKER_HOST`, else its socket).
   */
  readonly url: string | undefined;
  /** The bench's own engine client (the baselines, the plain client of B2's events). */
  readonly docker: Docker;
  /** `Docker` or `Podman`, for notes and row names. */
  readonly label: string;
}

/** The engine of that kind: Docker through `DOCKER_HOST`, Podman through `BENCH_PODMAN_HOST` or its default. */
export function engineTarget(kind: EngineKind): EngineTarget {
  if (kind === "docker") {
    return { kind, url: process.env.DOCKER_HOST, docker: testDocker(), label: "Docker" };
  }
  const url = process.env.BENCH_PODMAN_HOST ?? PODMAN_DEFAULT_URL;
  return { kind, url, docker: testDocker(url), label: "Podman" };
}

/** Thrown when `--engines` names something other than docker and podman. */
export class UnknownEngineError extends Error {
  constructor(readonly value: string) {
    super(`unknown engine ${JSON.stringify(value)} (use ${ENGINE_KINDS.join(",")})`);
    this.name = "UnknownEngineError";
  }
}

/**
 * `--engines docker,podman` → the kinds, each once, Docker first (the run's own engine, which
 * B3–B10 use); default Docker alone.
 */
export function parseEngines(value: string | undefined): EngineKind[] {
  if (value === undefined) return ["docker"];
  const kinds: EngineKind[] = [];
  for (const part of value.split(",").map((s) => s.trim().toLowerCase())) {
    if (part === "") continue;
    if (!(ENGINE_KINDS as readonly string[]).includes(part)) throw new UnknownEngineError(part);
    if (!kinds.includes(part as EngineKind)) kinds.push(part as EngineKind);
  }
  if (kinds.length === 0) throw new UnknownEngineError(value);
  return ENGINE_KINDS.filter((kind) => kinds.includes(kind));
}

/** Thrown when an engine does not answer, or answers as the other kind. */
export class EngineUnavailableError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "EngineUnavailableError";
  }
}

/**
 * Makes sure the engine answers and is the kind it is meant to be (a `DOCKER_HOST` pointed at
 * Podman must not produce rows called Docker's). For Podman at its default socket, first runs
 * `scripts/ensure-engine.mjs --engine podman` (idempotent: it starts the project's service only
 * when none answers), as `npm run bench` does for Docker.
 */
export async function checkEngine(target: EngineTarget): Promise<void> {
  if (target.kind === "podman" && target.url === PODMAN_DEFAULT_URL) {
    const script = resolve(import.meta.dirname, "../../scripts/ensure-engine.mjs");
    const result = spawnSync(process.execPath, [script, "--engine", "podman", "--quiet", "--engine-only"], {
      stdio: ["ignore", "inherit", "inherit"],
    });
    if (result.status !== 0)
      throw new EngineUnavailableError(`ensure-engine.mjs --engine podman failed (${result.status})`);
  }
  try {
    await target.docker.ping();
  } catch (error) {
    throw new EngineUnavailableError(
      `${target.label} does not answer at ${target.url ?? "the default socket"}`,
      {
        cause: error,
      },
    );
  }
  const podman = await isPodman(target.docker);
  if (podman !== (target.kind === "podman"))
    throw new EngineUnavailableError(
      `the ${target.kind} engine at ${target.url ?? "the default socket"} is ${podman ? "Podman" : "not Podman"}` +
        (target.kind === "docker"
          ? ": point DOCKER_HOST at Docker"
          : ": set BENCH_PODMAN_HOST to Podman's socket"),
    );
}

/** The engine's version as it reports it (`GET /version`: Podman's is its first component's). */
export async function engineVersion(target: EngineTarget): Promise<string> {
  const version = (await target.docker.version()) as {
    Version?: string;
    Components?: { Name?: string; Version?: string }[];
  };
  const podman = version.Components?.find((c) => c.Name === "Podman Engine");
  return podman?.Version ?? version.Version ?? "unknown";
}
