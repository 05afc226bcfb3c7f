/*
 * The image calls of the Engine API adapter: whether an image is there, and a pull (on Podman
 * completed to Docker's shape, `podman-compat.ts`).
 */
import type { Readable } from "node:stream";
import type { PullAuth } from "./docker-client.js";
import { DockerNotFoundError } from "./docker-errors.js";
import { DOCKER_DEADLINES, type EngineCalls } from "./engine-calls.js";
import type { EngineSystem } from "./engine-system.js";
import { completePodmanPull } from "./podman-compat.js";

/** Image inspect and pull over one {@link EngineCalls}. */
export class EngineImages {
  constructor(
    private readonly calls: EngineCalls,
    private readonly system: EngineSystem,
  ) {}

  /** Whether the image is on the engine (an image inspect). */
  async exists(reference: string, signal?: AbortSignal): Promise<boolean> {
    try {
      await this.calls.call("image-inspect", DOCKER_DEADLINES.image, signal, (abortSignal) =>
        this.calls.docker.getImage(reference).inspect({ abortSignal } as object),
      );
      return true;
    } catch (error) {
      if (error instanceof DockerNotFoundError) return false;
      throw error;
    }
  }

  /** Starts a pull; the stream is the engine's NDJSON progress, ended only through `signal`. */
  async pull(reference: string, auth: PullAuth | undefined, signal: AbortSignal): Promise<Readable> {
    const engine = await this.system.known(signal);
    const stream = await this.calls.counted(
      "pull",
      // fromImage carries the tag or digest, so the engine never pulls "all tags".
      async () =>
        (await this.calls.docker.createImage(auth ?? {}, {
          fromImage: reference,
          abortSignal: signal,
        })) as Readable,
    );
    if (engine.kind !== "podman") return stream;
    return completePodmanPull(stream, reference, () => this.exists(reference, signal));
  }
}
