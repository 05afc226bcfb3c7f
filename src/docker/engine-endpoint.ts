/*
 * Where the engine is: `--engine-url` (TASKSHIM_ENGINE_URL), else DOCKER_HOST, else the first
 * default socket that answers. Chosen once, at startup.
 */
import { lstat } from "node:fs/promises";

/** Docker's default socket. */
export const DOCKER_DEFAULT_URL = "unix:///var/run/docker.sock";
/** Rootful Podman's default socket (`podman system service`, podman.socket). */
export const PODMAN_DEFAULT_URL = "unix:///run/podman/podman.sock";

/** An engine URL that is neither `unix:///absolute/path` nor `tcp://host:port`. */
export class EngineUrlError extends Error {
  override readonly name = "EngineUrlError";
}

/** How the engine's address was found (the serve log says it). */
export type EngineUrlSource =
  "engine-url" | "DOCKER_HOST" | "home-record" | "docker-default" | "podman-default";

/** The engine's address and how it was chosen. */
export interface EngineEndpoint {
  readonly url: string;
  readonly source: EngineUrlSource;
  /** The addresses looked at, in order: a startup error that cannot reach the engine names them. */
  readonly tried: readonly string[];
}

/** The default sockets' facts, injected so tests need neither socket. */
export interface EngineProbe {
  /** Whether a socket file exists at this unix:// URL's path (answering or not). */
  exists(url: string): Promise<boolean>;
  /** Whether an engine answers a ping at this URL (under the ping's deadline); never throws. */
  answers(url: string): Promise<boolean>;
}

/**
 * Checks an `--engine-url` value: `unix:///absolute/path` or `tcp://host:port` (the forms
 * DOCKER_HOST takes); returns it trimmed.
 *
 * @throws EngineUrlError naming what is wrong.
 */
export function checkEngineUrl(value: string): string {
  const url = value.trim();
  if (url.startsWith("unix://")) {
    const path = url.slice("unix://".length);
    if (!path.startsWith("/") || path.includes("\0")) {
      throw new EngineUrlError(`engine URL ${JSON.stringify(value)}: expected unix:///absolute/path/to.sock`);
    }
    return url;
  }
  const tcp = /^tcp:\/\/(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})\/?$/.exec(url);
  const port = Number(tcp?.[2]);
  if (tcp && port >= 1 && port <= 65_535) return url;
  throw new EngineUrlError(
    `engine URL ${JSON.stringify(value)}: expected unix:///path/to.sock or tcp://host:port`,
  );
}

/**
 * Chooses the engine: `--engine-url` beats DOCKER_HOST, which beats the engine the home is bound
 * to (`recordedUrl`: never a fall-through to another engine for a home that has containers on
 * one), which beats the defaults. Without any, Docker's socket if it answers, else Podman's rootful socket if it answers, else
 * Docker's (the start then fails naming both). Podman's is taken only while no Docker socket
 * exists: a Docker socket that does not answer is a dockerd restarting, and a shim that turned
 * to Podman then would find none of its tasks' containers there and end them as lost.
 */
export async function chooseEngineEndpoint(
  settings: {
    readonly engineUrl: string;
    readonly dockerHost: string | undefined;
    readonly recordedUrl?: string | undefined;
  },
  probe: EngineProbe,
): Promise<EngineEndpoint> {
  if (settings.engineUrl !== "") {
    return { url: settings.engineUrl, source: "engine-url", tried: [settings.engineUrl] };
  }
  const dockerHost = settings.dockerHost?.trim() ?? "";
  if (dockerHost !== "") return { url: dockerHost, source: "DOCKER_HOST", tried: [dockerHost] };
  const recorded = settings.recordedUrl ?? "";
  if (recorded !== "") return { url: recorded, source: "home-record", tried: [recorded] };
  if (await probe.answers(DOCKER_DEFAULT_URL)) {
    return { url: DOCKER_DEFAULT_URL, source: "docker-default", tried: [DOCKER_DEFAULT_URL] };
  }
  if (await probe.exists(DOCKER_DEFAULT_URL)) {
    return { url: DOCKER_DEFAULT_URL, source: "docker-default", tried: [DOCKER_DEFAULT_URL] };
  }
  const tried = [DOCKER_DEFAULT_URL, PODMAN_DEFAULT_URL];
  if (await probe.answers(PODMAN_DEFAULT_URL))
    return { url: PODMAN_DEFAULT_URL, source: "podman-default", tried };
  return { url: DOCKER_DEFAULT_URL, source: "docker-default", tried };
}

/**
 * The host's sockets as {@link chooseEngineEndpoint} asks about them: `exists` looks at the
 * unix:// path (anything there counts, so a Docker socket that is only being recreated is not
 * passed over), `answers` is the engine's ping, given by the caller.
 */
export function localEngineProbe(ping: (url: string) => Promise<void>): EngineProbe {
  return {
    exists: async (url) => {
      if (!url.startsWith("unix://")) return false;
      return lstat(url.slice("unix://".length)).then(
        () => true,
        () => false,
      );
    },
    answers: (url) =>
      ping(url).then(
        () => true,
        () => false,
      ),
  };
}

/** The start's one line when no engine answered: the address, and what else was tried. */
export function unreachableMessage(endpoint: EngineEndpoint, why: string): string {
  const others = endpoint.tried.filter((url) => url !== endpoint.url);
  const also = others.length > 0 ? `; also tried ${others.join(", ")}; see --engine-url` : "";
  return `docker engine unreachable (${endpoint.url}${also}): ${why}`;
}
