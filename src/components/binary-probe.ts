import { open, stat } from "node:fs/promises";
import { errorMessage } from "../errors/error-message.js";
import { OperationBound } from "../exec/operation-bound.js";
import type { CommandRunner } from "../exec/run-bounded.js";
import type { ComponentName } from "./component-service.js";
import { identityOf, sameFile, type FileIdentity } from "./file-identity.js";

const VERSION_TIMEOUT_MS = 10_000;
/** Output of `<binary> --version`: `<name> version <X>`. */
const VERSION_LINE = /^(dstack-runner|dstack-shim|taskshim) version (\S+)$/;
/** The names each component's binary may give in its version line: taskshim is a dstack-shim. */
const BINARY_NAMES: Record<ComponentName, readonly string[]> = {
  "dstack-runner": ["dstack-runner"],
  "dstack-shim": ["dstack-shim", "taskshim"],
};
/** A build id as `version --json` may give it: printable ASCII, not a screenful. */
const BUILD_ID = /^[\x20-\x7e]{1,256}$/;
const ELF_MAGIC = Buffer.from([0x7f, 0x45, 0x4c, 0x46]);

/** What a look at a binary found: what the slot reports, and why it is not installed. */
export interface Observation {
  readonly status: "not-installed" | "installed" | "error";
  readonly version: string;
  readonly buildId?: string;
  /** The name its version line gave (`taskshim`, `dstack-shim`, `dstack-runner`). */
  readonly binary?: string;
  /** The file looked at, as it was when its `--version` ran; undefined when missing. */
  readonly identity?: FileIdentity;
  /**
   * Why the file does not count as this component's binary (for an install's error): what it
   * is (`content`: it prints another line), or that it could not be asked (`run`).
   */
  readonly problem?: { readonly kind: "content" | "run"; readonly message: string };
}

export const NOT_INSTALLED: Observation = { status: "not-installed", version: "" };

/**
 * The executable this very process runs from, where it is known exactly: the single binary,
 * whose `/proc/self/exe` is the inode the kernel ran (a rename over its path since leaves that
 * inode, and a write in place changes its times). A dstack-shim slot holding that same file is
 * this build: nothing needs to run to say so.
 */
export interface RunningExecutable {
  /** The identity of the inode that runs (undefined when it cannot be had: then the probe runs). */
  identity(): Promise<FileIdentity | undefined>;
  readonly version: string;
  readonly buildId: string;
}

/** Runs a component binary's `--version` (and a taskshim's `version --json`) to tell what it is. */
export class BinaryProbe {
  constructor(
    private readonly commands: CommandRunner,
    private readonly running?: RunningExecutable,
  ) {}

  /**
   * Looks at a binary: missing, this component's (its `--version` printed its version line, under
   * one 10 s deadline with the build id's step), or something else. Never throws.
   */
  async probe(name: ComponentName, path: string): Promise<Observation> {
    let identity: FileIdentity;
    try {
      identity = identityOf(await stat(path, { bigint: true }));
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return NOT_INSTALLED;
      return {
        status: "error",
        version: "",
        problem: { kind: "run", message: `cannot stat it: ${errorMessage(error)}` },
      };
    }
    // The shim's own binary at its slot (every restart of a deployed shim): two starts of a large
    // executable spared, each one CPU a restart would share with the API's first answers.
    if (name === "dstack-shim" && this.running && sameFile(identity, await this.running.identity())) {
      const { version, buildId } = this.running;
      return { status: "installed", version, binary: "taskshim", identity, buildId };
    }
    const bound = OperationBound.within(VERSION_TIMEOUT_MS);
    const ran = await this.run([path, "--version"], bound);
    if ("problem" in ran) {
      return {
        status: "error",
        version: "",
        identity,
        problem: { kind: "run", message: `--version: ${ran.problem}` },
      };
    }
    const line = ran.stdout.trim();
    const match = VERSION_LINE.exec(line);
    // Stryker disable next-line StringLiteral,ArrayDeclaration: the defaults are read only after a match, whose two groups always match
    const [, binaryName = "", version = ""] = match ?? [];
    if (!match) {
      return {
        status: "error",
        version: "",
        identity,
        problem: { kind: "content", message: `--version printed ${JSON.stringify(line.slice(0, 120))}` },
      };
    }
    if (!BINARY_NAMES[name].includes(binaryName)) {
      return {
        status: "error",
        version: "",
        identity,
        problem: { kind: "content", message: `it is ${binaryName} (--version printed "${line}")` },
      };
    }
    // Only a taskshim is asked: a Go dstack-shim has no `version` command, and given unknown
    // arguments it would start serving.
    const buildId = binaryName === "taskshim" ? await this.buildId(path, bound) : undefined;
    return {
      status: "installed",
      version,
      binary: binaryName,
      identity,
      ...(buildId !== undefined ? { buildId } : {}),
    };
  }

  /** The `build_id` of `<binary> version --json`; undefined when it fails or has none (older releases). */
  private async buildId(path: string, bound: OperationBound): Promise<string | undefined> {
    const ran = await this.run([path, "version", "--json"], bound);
    if ("problem" in ran) return undefined;
    try {
      const parsed: unknown = JSON.parse(ran.stdout);
      if (typeof parsed !== "object" || parsed === null || !("build_id" in parsed)) return undefined;
      const id = parsed.build_id;
      return typeof id === "string" && BUILD_ID.test(id) ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /** Runs a check command under `bound`: its stdout when it exited 0, else what went wrong. */
  private async run(
    argv: readonly string[],
    bound: OperationBound,
  ): Promise<{ readonly stdout: string } | { readonly problem: string }> {
    try {
      const outcome = await this.commands.run({ argv, bound });
      switch (outcome.kind) {
        case "exited":
          if (outcome.code === 0) return { stdout: outcome.stdout.toString("utf8") };
          return {
            problem:
              outcome.code === null
                ? `killed by ${outcome.signal ?? "a signal"}`
                : `exit status ${outcome.code}`,
          };
        case "expired":
          return { problem: `did not finish within ${VERSION_TIMEOUT_MS} ms` };
        case "interrupted":
          return { problem: "interrupted by shutdown" };
      }
    } catch (error) {
      return { problem: errorMessage(error) };
    }
  }
}

/** Whether a file starts as an ELF executable (`\x7fELF`) or a script (`#!`) does. */
export async function isExecutableFormat(path: string): Promise<boolean> {
  const handle = await open(path, "r");
  try {
    const head = Buffer.alloc(4);
    const { bytesRead } = await handle.read(head, 0, head.length, 0);
    const start = head.subarray(0, bytesRead);
    return start.equals(ELF_MAGIC) || start.subarray(0, 2).toString("latin1") === "#!";
  } finally {
    await handle.close();
  }
}
