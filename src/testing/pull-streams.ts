/* What an image pull sends: the NDJSON progress streams the fake engine answers pulls with. */
import { Readable } from "node:stream";

/** A pull that succeeds: one layer downloaded and extracted, then the final status line. */
export const SUCCESSFUL_PULL_LINES: readonly string[] = [
  '{"status":"Pulling from library/busybox","id":"1.36"}',
  '{"status":"Pulling fs layer","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Downloading","progressDetail":{"current":512,"total":1024},"id":"a1b2c3d4e5f6"}',
  '{"status":"Download complete","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Extracting","progressDetail":{"current":1024,"total":1024},"id":"a1b2c3d4e5f6"}',
  '{"status":"Pull complete","progressDetail":{},"id":"a1b2c3d4e5f6"}',
  '{"status":"Digest: sha256:0000000000000000000000000000000000000000000000000000000000000000"}',
  '{"status":"Status: Downloaded newer image for busybox:1.36"}',
];

/** A pull stream of the given NDJSON lines (each is sent as its own chunk). */
export function pullStream(lines: readonly string[]): Readable {
  return Readable.from(lines.map((line) => Buffer.from(`${line}\n`)));
}

/**
 * A pull stream that sends `lines` and then stays open (like a slow registry) until `signal`
 * aborts; it never sends the final status line.
 */
export function stalledPullStream(lines: readonly string[], signal: AbortSignal): Readable {
  async function* generate(): AsyncGenerator<Buffer> {
    for (const line of lines) yield Buffer.from(`${line}\n`);
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", () => resolve(), { once: true });
    });
  }
  return Readable.from(generate());
}
