/**
 * The variable through which `taskshim supervise` tells the shims it starts after a rollback
 * what it rolled back, so that their healthcheck (and `taskshim status`, `taskshim upgrade`) can
 * say so. A release from before it ignores it.
 */
export const ROLLBACK_ENV = "TASKSHIM_SUPERVISOR_ROLLBACK";

/** The last rollback of the supervisor that started this shim: a new binary that never served. */
export interface RollbackReport {
  /** When the previous binary was put back (ISO 8601, the supervisor's clock). */
  readonly at: string;
  /** Why, in one line: `exited 78 before serving (ran 0.4 s)`, `did not serve within 60s`. */
  readonly reason: string;
  /** The path the failed binary was replaced at (the previous one runs from it again). */
  readonly binary: string;
}

/** The report a shim was started with, or undefined when none (or an unreadable one). */
export function readRollbackReport(env: NodeJS.ProcessEnv): RollbackReport | undefined {
  const text = env[ROLLBACK_ENV];
  if (text === undefined || text === "") return undefined;
  try {
    const parsed = JSON.parse(text) as Partial<RollbackReport>;
    const { at, reason, binary } = parsed;
    if (typeof at !== "string" || typeof reason !== "string" || typeof binary !== "string") return undefined;
    return { at, reason, binary };
  } catch {
    return undefined;
  }
}
