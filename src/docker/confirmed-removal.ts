import { setTimeout as sleep } from "node:timers/promises";
import type { CleanupEvidence } from "../exec/cleanup-evidence.js";
import type { OperationBound } from "../exec/operation-bound.js";
import type { RemovalConfirmed } from "./docker-client.js";
import { RemovalUnconfirmedError, type RemovalUnconfirmedReason } from "./docker-errors.js";

/** How long a removal may take before it is reported as unconfirmed (the seed's `REMOVAL_TIMEOUT`). */
export const REMOVAL_TIMEOUT_MS = 30_000;
/** How often a removal "already in progress" is checked for the container to be gone. */
const REMOVAL_POLL_MS = 250;

/** What the daemon answered to one forced removal. */
export type RemoveAnswer =
  | { readonly kind: "removed" }
  /** "No such container": the daemon no longer knows it, which confirms the removal. */
  | { readonly kind: "absent" }
  /** "removal of container … is already in progress": the daemon owns an in-flight removal. */
  | { readonly kind: "in-progress" }
  | { readonly kind: "failed"; readonly reason: RemovalUnconfirmedReason };

/** What the daemon answered to one inspect while a removal is in progress. */
export type InspectAnswer =
  /** A definitive "No such container". */
  | { readonly kind: "absent" }
  /** Anything else (still there, an error, a timeout…): it proves nothing. */
  | { readonly kind: "unknown"; readonly cleanup: CleanupEvidence | null };

/**
 * One way to reach a container's daemon: the Engine API, the local docker CLI, or the docker CLI
 * over SSH. Each call must stay within `bound`.
 */
export interface RemovalChannel {
  remove(container: string, bound: OperationBound): Promise<RemoveAnswer>;
  inspect(container: string, bound: OperationBound): Promise<InspectAnswer>;
}

/**
 * The seed's confirmed removal, the one policy behind every path: a forced removal that succeeds
 * is `removed`; "No such container" is `already-absent` (confirmed, not a failure); "already in
 * progress" (a `--rm` container whose exit races this removal) polls inspect every 250 ms until
 * the daemon no longer knows the container (`already-absent`: someone else removed it) or the
 * bound runs out. Any answer but a definitive not-found keeps polling; the deadline decides.
 * Anything else throws `RemovalUnconfirmedError` with a typed reason.
 */
export async function confirmRemoval(
  channel: RemovalChannel,
  container: string,
  bound: OperationBound,
): Promise<RemovalConfirmed> {
  const answer = await channel.remove(container, bound);
  switch (answer.kind) {
    case "removed":
      return "removed";
    case "absent":
      return "already-absent";
    case "failed":
      throw new RemovalUnconfirmedError(container, answer.reason);
    case "in-progress":
      break;
  }
  let lastCleanup: CleanupEvidence | null = null;
  for (;;) {
    const probe = await channel.inspect(container, bound);
    if (probe.kind === "absent") return "already-absent";
    lastCleanup = probe.cleanup ?? lastCleanup;
    const left = bound.remainingMs(REMOVAL_POLL_MS);
    if (left === 0) break;
    await sleep(left ?? REMOVAL_POLL_MS);
    if (bound.expired()) break;
  }
  throw new RemovalUnconfirmedError(container, {
    kind: "deadline",
    elapsedMs: bound.elapsedMs(),
    cleanup: lastCleanup,
    detail: "removal already in progress; the container did not disappear",
  });
}
