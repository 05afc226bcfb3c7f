/**
 * Termination reasons a dstack server accepts (`JobTerminationReason`, lower-case values).
 * The shim sets the first four itself; the rest arrive through `/terminate`.
 */
export const TERMINATION_REASONS = [
  "executor_error",
  "creating_container_error",
  "container_exited_with_error",
  "done_by_runner",
  "terminated_by_user",
  "terminated_by_server",
  "max_duration_exceeded",
  "log_quota_exceeded",
  "failed_to_start_due_to_no_capacity",
  "interrupted_by_no_capacity",
  "instance_unreachable",
  "waiting_instance_limit_exceeded",
  "waiting_runner_limit_exceeded",
  "ports_binding_failed",
  "aborted_by_user",
  "scaled_down",
  "inactivity_duration_exceeded",
  "terminated_due_to_utilization_policy",
  "gateway_error",
  "instance_access_revoked",
  "volume_error",
] as const;

/** A valid termination reason. */
export type TerminationReason = (typeof TERMINATION_REASONS)[number];

const KNOWN = new Set<string>(TERMINATION_REASONS);

/**
 * Normalises a reason received from a client: lower-cased and trimmed; `""` and values the
 * server could not parse back become `fallback`, so a terminated task never carries an
 * unparseable reason (the dstack server parses it into its enum and raises on `""` or an unknown value).
 */
export function normalizeTerminationReason(raw: string, fallback: TerminationReason): TerminationReason {
  const value = raw.trim().toLowerCase();
  return KNOWN.has(value) ? (value as TerminationReason) : fallback;
}

/** Whether `value` is a known reason. */
export function isTerminationReason(value: string): value is TerminationReason {
  return KNOWN.has(value);
}
