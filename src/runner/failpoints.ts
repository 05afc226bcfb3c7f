import { setTimeout as sleep } from "node:timers/promises";

/** The environment variable that arms failpoints: `point=action[,point=action…]`. */
export const FAILPOINTS_ENV = "TASKSHIM_FAILPOINTS";

/**
 * What an armed failpoint does: `kill` (SIGKILL to the shim itself, as a crash would),
 * `exit(code)`, `delay(ms)`, `error(message)` (the step throws; `error(EIO)` throws an error
 * with that errno code), `hang` (never returns).
 * A `N*` prefix fires only the first N times (`after-state:running=1*kill`).
 */
export type FailpointAction =
  | { readonly kind: "kill" }
  | { readonly kind: "exit"; readonly code: number }
  | { readonly kind: "delay"; readonly ms: number }
  | { readonly kind: "error"; readonly message: string }
  | { readonly kind: "hang" };

interface Armed {
  readonly action: FailpointAction;
  remaining: number;
}

/**
 * A failpoint action fired: the step it guards fails with this error. `error(EIO)` (an errno
 * name as the message) carries that `code`, as the file-system call it stands for would.
 */
export class FailpointError extends Error {
  override readonly name = "FailpointError";
  readonly code: string | undefined;
  constructor(point: string, message: string) {
    const errno = /^E[A-Z0-9]+$/.test(message) ? message : undefined;
    super(errno ? `${errno}: injected by failpoint ${point}` : `failpoint ${point}: ${message}`);
    this.code = errno;
  }
}

/** The spec in FAILPOINTS_ENV cannot be parsed. */
export class InvalidFailpointsError extends Error {
  override readonly name = "InvalidFailpointsError";
}

let armed: Map<string, Armed> | undefined;

function parseAction(text: string): FailpointAction {
  const match = /^(kill|hang|exit|delay|error)(?:\((.*)\))?$/.exec(text);
  const kind = match?.[1];
  const arg = match?.[2] ?? "";
  if (kind === "kill" || kind === "hang") return { kind };
  if (kind === "exit") return { kind, code: Number(arg || 1) };
  if (kind === "delay") return { kind, ms: Number(arg || 1000) };
  if (kind === "error") return { kind, message: arg || "failpoint" };
  throw new InvalidFailpointsError(`unknown failpoint action ${JSON.stringify(text)}`);
}

/** Parses a failpoint spec (`a=kill,b=2*delay(500)`). */
export function parseFailpoints(spec: string): Map<string, Armed> {
  const result = new Map<string, Armed>();
  for (const entry of spec
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    const eq = entry.indexOf("=");
    if (eq <= 0) throw new InvalidFailpointsError(`failpoint entry ${JSON.stringify(entry)} has no action`);
    const point = entry.slice(0, eq);
    // Stryker disable next-line Regex: the greedy `(.*)` reaches the end anyway, so dropping `$` matches the same
    const counted = /^(\d+)\*(.*)$/.exec(entry.slice(eq + 1));
    result.set(point, {
      // Stryker disable next-line StringLiteral: group 2 always takes part in a match, so the fallback is never used
      action: parseAction(counted ? (counted[2] ?? "") : entry.slice(eq + 1)),
      remaining: counted ? Number(counted[1]) : Infinity,
    });
  }
  return result;
}

/** Arms failpoints from a spec (or disarms them with undefined or ""). Called once at startup. */
export function armFailpoints(spec: string | undefined): void {
  armed = spec ? parseFailpoints(spec) : undefined;
}

/**
 * Marks a durable step. Off (the default) it returns undefined at once: `await` of it costs
 * one microtask and nothing else. Armed, it runs the step's action.
 */
export function failpoint(point: string): Promise<void> | undefined {
  if (armed === undefined) return undefined;
  const entry = armed.get(point);
  if (!entry || entry.remaining <= 0) return undefined;
  entry.remaining -= 1;
  const { action } = entry;
  switch (action.kind) {
    case "kill":
      process.kill(process.pid, "SIGKILL");
      return new Promise<void>(() => undefined);
    case "exit":
      return process.exit(action.code);
    case "delay":
      return sleep(action.ms);
    case "error":
      return Promise.reject(new FailpointError(point, action.message));
    case "hang":
      return new Promise<void>(() => undefined);
  }
}
