import Type, { type Static } from "typebox";
import Value from "typebox/value";

/** Why a command's process group had to be killed. */
export type CleanupTrigger = "deadline" | "interruption" | "wait_failure";

/** A plain, serialisable record of what happened when a command was killed and reaped. */
export const CleanupEvidenceSchema = Type.Object(
  {
    trigger: Type.Union([
      Type.Literal("deadline"),
      Type.Literal("interruption"),
      Type.Literal("wait_failure"),
    ]),
    elapsed_ms: Type.Integer({ minimum: 0 }),
    reap_grace_ms: Type.Integer({ minimum: 0 }),
    io_drain_grace_ms: Type.Integer({ minimum: 0 }),
    kill_attempted: Type.Boolean(),
    verified: Type.Boolean(),
    error: Type.Union([Type.String(), Type.Null()]),
  },
  { additionalProperties: false },
);

/** Evidence of a kill-and-reap, as written to logs and error records. */
export type CleanupEvidence = Static<typeof CleanupEvidenceSchema>;

/** Thrown when serialised evidence does not match the schema (unknown fields included). */
export class InvalidCleanupEvidenceError extends Error {
  override readonly name = "InvalidCleanupEvidenceError";
}

/** Parses evidence back from JSON text, rejecting unknown or missing fields. */
export function parseCleanupEvidence(text: string): CleanupEvidence {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (cause) {
    throw new InvalidCleanupEvidenceError("cleanup evidence is not JSON", { cause });
  }
  if (!Value.Check(CleanupEvidenceSchema, raw)) {
    const first = Value.Errors(CleanupEvidenceSchema, raw)[0];
    throw new InvalidCleanupEvidenceError(
      `invalid cleanup evidence: ${first ? `${first.instancePath || "/"} ${first.message}` : "unknown"}`,
    );
  }
  return raw;
}
