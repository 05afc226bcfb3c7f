/*
 * Where Podman's Docker-compatible API answers differently from Docker's, and the shim must not
 * notice. Each difference is one small function with the reason it exists; the adapter's
 * families of calls (`engine-*.ts`, `container-answers.ts`) call it only when the engine is
 * Podman. Differences found by running the docker tests on Podman 4.3.1 (TESTING.md, "Two
 * engines").
 */
import { Transform, type Readable, pipeline } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import type { ContainerState } from "./docker-client.js";

/**
 * The `Status: …` line a Docker pull ends with, written for a Podman pull that ended cleanly
 * with the image present. The consumer (`consumePullStream`) waits for such a line.
 */
export function podmanPullFinalLine(reference: string): string {
  return JSON.stringify({ status: `Status: Downloaded newer image for ${reference}` });
}

/**
 * Why: Docker's pull stream ends with `{"status":"Status: Downloaded newer image for …"}` (or
 * `Image is up to date`), and a stream without that line is an incomplete pull. Podman's never
 * has one: its last line is `{"status":"Download complete","id":"<image id>"}`, the same status
 * its layers report, and a failure is an `error` line. So on Podman a stream that ends without
 * an error line is complete only if the image is then there (`confirm`, an image inspect): that
 * turns it into Docker's shape by adding the final line. A stream cut off or carrying an error
 * is passed on unchanged, so the consumer still reports it as incomplete or failed.
 *
 * The returned stream passes every byte of `source` through; destroying it destroys `source`.
 */
export function completePodmanPull(
  source: Readable,
  reference: string,
  confirm: () => Promise<boolean>,
): Readable {
  const decoder = new StringDecoder("utf8");
  let partial = "";
  let endsWithNewline = true;
  let settled = false; // a final status or an error line was seen: nothing to add
  const scan = (line: string): void => {
    if (settled || line.trim() === "") return;
    try {
      const message = JSON.parse(line) as { status?: unknown; error?: unknown; errorDetail?: unknown };
      if (message.error !== undefined || message.errorDetail !== undefined) settled = true;
      else if (typeof message.status === "string" && message.status.startsWith("Status:")) settled = true;
    } catch {
      // not JSON: the consumer skips it too
    }
  };
  const completed = new Transform({
    transform(chunk: Buffer, _encoding, done): void {
      const text = partial + decoder.write(chunk);
      const lines = text.split("\n");
      partial = lines.pop() ?? "";
      lines.forEach(scan);
      if (chunk.length > 0) endsWithNewline = chunk[chunk.length - 1] === 0x0a;
      done(null, chunk);
    },
    flush(done): void {
      scan(partial + decoder.end());
      if (settled) {
        done();
        return;
      }
      confirm().then(
        (present) =>
          done(null, present ? `${endsWithNewline ? "" : "\n"}${podmanPullFinalLine(reference)}\n` : null),
        // An inspect that fails proves nothing: no final line, so the pull counts as incomplete.
        () => done(),
      );
    },
  });
  // pipeline: a consumer that destroys the returned stream (an abort) destroys the engine's too.
  return pipeline(source, completed, () => undefined);
}

/**
 * An engine's container status as one of Docker's ({@link ContainerState}).
 *
 * Why: Podman's compatible API reports two statuses Docker has not. `stopped` (the process is
 * gone and its exit code read from conmon's exit file, the cleanup not yet done) is Docker's
 * `exited`. `stopping` (a stop is under way) reports the exit code of before the stop, 0: read
 * as finished it recorded a workload killed with 137 or exiting with 3 as exit 0. It still runs
 * as far as the outcome is concerned. Podman's `configured` and `initialized` are created
 * containers that never ran. Any other status unknown to the shim is read as running: an
 * outcome is only ever taken from a status known to be final.
 */
export function containerStateOf(status: string): ContainerState {
  switch (status) {
    case "created":
    case "running":
    case "paused":
    case "restarting":
    case "removing":
    case "exited":
    case "dead":
      return status;
    case "stopped":
      return "exited";
    case "configured":
    case "initialized":
      return "created";
    default:
      return "running";
  }
}
