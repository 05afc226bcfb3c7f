import { selfInvocation } from "./self-invocation.js";
import { execFile } from "node:child_process";
import { SERVE_SETTINGS } from "../config/shim-config.js";
import { errorMessage } from "../errors/error-message.js";

/**
 * How long `<binary> serve --help` may take: a single binary answers in well under a second, and
 * a binary that hangs is given its flags as they are (it is then judged by whether it serves).
 */
const HELP_TIMEOUT_MS = 5_000;

/** What a release's `serve --help` says it accepts. */
export interface ServeHelp {
  /** Its long flags, `--shim-home`… */
  readonly flags: ReadonlySet<string>;
  /** The variables it names (`[env DSTACK_SHIM_HOME]`). */
  readonly variables: ReadonlySet<string>;
}

/** Which serve flags were handed to a shim, and which were left out because it does not know them. */
export interface ServeArgsFit {
  readonly args: readonly string[];
  /** The flags left out (with their values), by name. */
  readonly dropped: readonly string[];
  /** Serve variables set in the environment that the release does not name: it ignores them. */
  readonly ignoredVariables: readonly string[];
}

/**
 * Reads commander's help of every release since 1.0.0: an option's line starts with two spaces
 * and its flags (`  -h, --help`, `  --shim-home <dir>`); a wrapped description's lines start
 * further in, and `[env NAME]` may be wrapped between its two words.
 */
export function parseServeHelp(text: string): ServeHelp {
  const flags = new Set<string>();
  for (const line of text.split("\n")) {
    const head = /^ {2}(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)/.exec(line);
    if (head?.[1] !== undefined) flags.add(head[1]);
  }
  const variables = new Set([...text.matchAll(/\[env\s+([A-Z][A-Z0-9_]*)\]/g)].map((m) => m[1] ?? ""));
  return { flags, variables };
}

/** Whether each serve flag of this version takes a value: `<v>` always, `[v]` when one follows. */
const ARITY: ReadonlyMap<string, "required" | "optional"> = new Map(
  Object.values(SERVE_SETTINGS).map((s) => {
    const [name = "", value = ""] = s.flag.split(" ");
    return [name, value.startsWith("[") ? "optional" : "required"] as const;
  }),
);

/**
 * The serve arguments a release accepts: every flag of this version its help does not list is
 * left out with its value. Anything else (a flag this version does not know, a bare word) is
 * passed on as given: the release then says what is wrong with it.
 */
export function fitServeArgs(
  args: readonly string[],
  help: ServeHelp,
  env: NodeJS.ProcessEnv = {},
): ServeArgsFit {
  const kept: string[] = [];
  const dropped: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const token = args[i] ?? "";
    if (token === "--") {
      kept.push(...args.slice(i));
      break;
    }
    const flag = /^(--[a-z0-9][a-z0-9-]*)(=.*)?$/s.exec(token);
    const name = flag?.[1];
    const arity = name === undefined ? undefined : ARITY.get(name);
    if (name === undefined || arity === undefined) {
      kept.push(token);
      continue;
    }
    const group = [token];
    const next = args[i + 1];
    if (flag?.[2] === undefined && next !== undefined) {
      if (arity === "required" || !next.startsWith("-")) group.push(next);
    }
    i += group.length - 1;
    if (help.flags.has(name)) kept.push(...group);
    else dropped.push(name);
  }
  const ignoredVariables = Object.values(SERVE_SETTINGS)
    .map((s) => s.env)
    .filter((name) => env[name] !== undefined && !help.variables.has(name));
  return { args: kept, dropped, ignoredVariables: [...new Set(ignoredVariables)] };
}

/** A binary whose `serve --help` could not be read. */
export class ServeHelpError extends Error {
  override readonly name = "ServeHelpError";
}

/** Runs `<binary> serve --help` and reads what it accepts. */
export async function probeServeHelp(binary: string, env: NodeJS.ProcessEnv): Promise<ServeHelp> {
  const stdout = await new Promise<string>((resolve, reject) => {
    const self = selfInvocation(binary);
    execFile(
      self.file,
      [...self.args, "serve", "--help"],
      { timeout: HELP_TIMEOUT_MS, env, maxBuffer: 1024 * 1024, encoding: "utf8" },
      (error, out) => {
        if (error)
          reject(new ServeHelpError(`${binary} serve --help: ${errorMessage(error)}`, { cause: error }));
        else resolve(out);
      },
    );
  });
  const help = parseServeHelp(stdout);
  if (!help.flags.has("--shim-home")) {
    throw new ServeHelpError(`${binary} serve --help lists no --shim-home: not a taskshim's help`);
  }
  return help;
}
