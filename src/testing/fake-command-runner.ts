/* A scripted `CommandRunner`: external commands (mountpoint, umount, ssh, …) answered in memory. */
import type { BoundedOutcome, CommandRequest, CommandRunner } from "../exec/run-bounded.js";

/** Answers external commands from a script; by default it is a host where nothing is mounted. */
export class FakeCommandRunner implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  /** Mount points `mountpoint -q` reports as mounted; `umount` removes them. */
  readonly mounted = new Set<string>();
  /** Overrides the default answers when it returns an outcome. */
  script: ((argv: readonly string[]) => BoundedOutcome | Promise<BoundedOutcome> | undefined) | undefined;

  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const scripted = this.script?.(request.argv);
    if (scripted) return Promise.resolve(scripted);
    const [program, ...args] = request.argv;
    const target = args.at(-1) ?? "";
    if (program === "mountpoint") return Promise.resolve(exited(this.mounted.has(target) ? 0 : 1));
    if (program === "umount") this.mounted.delete(target);
    return Promise.resolve(exited(0));
  }

  /** The argv of every call whose program is `program`. */
  argvsOf(program: string): string[][] {
    return this.calls.map((call) => [...call.argv]).filter((argv) => argv[0] === program);
  }
}

/** An `exited` outcome of a command. */
export function exited(code: number, stdout = "", stderr = ""): BoundedOutcome {
  return { kind: "exited", code, signal: null, stdout: Buffer.from(stdout), stderr: Buffer.from(stderr) };
}

/**
 * Answers every command from one script alone (what a host's tools would print): an outcome, or
 * an error the run rejects with (a command that cannot start). Records each call.
 */
export class ScriptedCommands implements CommandRunner {
  readonly calls: CommandRequest[] = [];
  constructor(
    private readonly script: (argv: readonly string[]) => BoundedOutcome | Error | Promise<BoundedOutcome>,
  ) {}

  run(request: CommandRequest): Promise<BoundedOutcome> {
    this.calls.push(request);
    const result = this.script(request.argv);
    return result instanceof Error ? Promise.reject(result) : Promise.resolve(result);
  }

  /** Each call's argv joined by spaces, in order. */
  argvs(): string[] {
    return this.calls.map((call) => call.argv.join(" "));
  }
}

/** An `expired` outcome: the bound ran out and the command was killed (cleanly). */
export const EXPIRED: BoundedOutcome = {
  kind: "expired",
  kill: { ok: true },
  operationElapsedMs: 10_000,
  cleanup: null,
};

/** An `interrupted` outcome: the shim's shutdown killed the command (cleanly, after 5 ms). */
export const INTERRUPTED: BoundedOutcome = {
  kind: "interrupted",
  kill: { ok: true },
  operationElapsedMs: 5,
  cleanup: {
    trigger: "interruption",
    elapsed_ms: 5,
    reap_grace_ms: 0,
    io_drain_grace_ms: 0,
    kill_attempted: true,
    verified: true,
    error: null,
  },
};
