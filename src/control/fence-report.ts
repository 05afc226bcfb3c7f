import type { CliTarget } from "../docker/cli-removal.js";

/*
 * What a fence is asked and what it reports: the vocabulary both of its paths share, the shim's
 * API (fence-api.ts) and the docker CLI (fence-cli.ts). fence.ts decides which path runs.
 */

/** Removals run at once on one host. */
export const FENCE_CONCURRENCY = 4;

/** Which of a host's task containers to fence. */
export type FenceSelection =
  { readonly kind: "all" } | { readonly kind: "tasks"; readonly ids: readonly string[] };

/** How one task container ended. */
export type FenceOutcome = "removed" | "already_absent" | "unconfirmed";

/** Which path had the last word: the shim's API, or the docker CLI over SSH or locally. */
export type FenceVia = "api" | "ssh" | "local";

/** One container (or one requested task) of a fence. */
export interface FenceResult {
  /** The container's name; null when no container was found (or the host could not be listed). */
  readonly container: string | null;
  readonly task_id: string | null;
  readonly outcome: FenceOutcome;
  /** Why it is unconfirmed (`deadline`, `ssh`, `exit`, `unknown_to_shim`…); null when confirmed. */
  readonly reason: string | null;
  /** The path that decided this result (a host's results may come from both). */
  readonly via: FenceVia;
  readonly evidence: Readonly<Record<string, unknown>>;
}

/**
 * Why the host as a whole is not confirmed, apart from any one result: it could not be listed
 * (`ssh`, `deadline`, `exit`, `listing`…), the peer is no shim (`not_a_shim`), the shim did not
 * answer (`shim_unreachable`) or refused its list (`shim`), or `--all` went through a shim only,
 * which cannot see containers it does not know (`engine_not_listed`).
 */
export interface FenceHostError {
  readonly reason: string;
  /** One line, as the table prints it. */
  readonly detail: string;
  readonly evidence: Readonly<Record<string, unknown>>;
}

/** What `taskshim fence --json` prints. */
export interface FenceReport {
  /** The docker CLI's target when it was used, else the shim's `host:port`. */
  readonly host: string;
  /** `ssh` or `local` when the engine was listed (or tried), `api` when only the shim was asked. */
  readonly via: FenceVia;
  /** True only when the host could be seen whole and every result is confirmed. */
  readonly confirmed: boolean;
  /** The host-level failure; null when there is none (then `confirmed` is up to the results). */
  readonly error: FenceHostError | null;
  readonly results: readonly FenceResult[];
}

/** A fence request, parsed from the command line. */
export interface FenceRequest {
  /** Ask this shim first (`--shim`). */
  readonly shimUrl?: string;
  /** Bearer token for the shim. */
  readonly authToken?: string;
  /** Where the docker CLI runs (`--ssh` or `--local`), alone or to check what the shim did not confirm. */
  readonly cli?: CliTarget;
  readonly selection: FenceSelection;
  /** Bounds each removal, each listing and each shim call. */
  readonly deadlineMs: number;
  /** Extra `KEY=VALUE` labels a container must carry too (narrows, never widens). */
  readonly labels?: readonly string[];
}

/** A host's report: confirmed only when the host was seen whole and every result is confirmed. */
export function report(
  host: string,
  via: FenceVia,
  results: readonly FenceResult[],
  error: FenceHostError | null,
): FenceReport {
  return {
    host,
    via,
    confirmed: error === null && results.every((r) => r.outcome !== "unconfirmed"),
    error,
    results,
  };
}

/** One unconfirmed row per requested task of a host that could not be seen. */
export function unseen(ids: readonly string[], via: FenceVia, error: FenceHostError): FenceResult[] {
  return ids.map((id) => ({
    container: null,
    task_id: id,
    outcome: "unconfirmed",
    reason: error.reason,
    via,
    evidence: { ...error.evidence, detail: error.detail },
  }));
}
