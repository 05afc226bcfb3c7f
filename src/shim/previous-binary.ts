import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { copyFile, link, open, realpath, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileIdentity, type FileIdentity } from "../components/file-identity.js";
import { errorMessage } from "../errors/error-message.js";
import { syncDirectory } from "../state/durable-write.js";

/** The suffix of the last binary that served, beside the one `supervise` runs. */
export const PREVIOUS_SUFFIX = ".previous";

/** The previous binary could not be kept or put back; the message says which file and why. */
export class PreviousBinaryError extends Error {
  override readonly name = "PreviousBinaryError";
}

/**
 * Where the binary `supervise` is about to start stands:
 * - `proven`: it is the binary kept as `<binary>.previous` (it served before), or nothing is kept
 *   yet: there is nothing to go back to;
 * - `trial`: another binary than the one kept (an install renamed it over the path), or none at
 *   all: if it does not serve, the kept one goes back.
 */
export type BinaryStanding =
  | { readonly kind: "proven"; readonly identity: FileIdentity | undefined }
  | { readonly kind: "trial"; readonly identity: FileIdentity | undefined };

/**
 * `<binary>.previous`: a hard link to (or, where links cannot be made, a copy of) the last binary
 * that served under this supervisor. An install renames its download over `<binary>`, which
 * leaves the kept inode alone, so the kept binary is there whatever the install put in place.
 * Both the keeping and the putting back are a new name made beside the target and renamed over
 * it, and the directory fsynced: a crash leaves the old file or the new one at each path, never
 * none and never a partial one.
 */
export class PreviousBinary {
  readonly path: string;
  /** The file last kept (or found kept and the same bytes as the binary): a proven binary. */
  #kept: FileIdentity | undefined;

  constructor(readonly binary: string) {
    this.path = `${binary}${PREVIOUS_SUFFIX}`;
  }

  /** Whether the binary at the path now is the kept one, another one on trial, or all there is. */
  async standing(): Promise<BinaryStanding> {
    const identity = await fileIdentity(this.binary);
    const kept = await fileIdentity(this.path);
    if (kept === undefined) return { kind: "proven", identity };
    // No binary at the path (deleted, or renamed away): it cannot start, and the kept one goes back.
    if (identity === undefined) return { kind: "trial", identity };
    if (kept.dev === identity.dev && kept.ino === identity.ino) return { kind: "proven", identity };
    // A copy (no hard link could be made) of the binary in place, or the one a supervisor before
    // this one kept: the same bytes are the same binary.
    if (this.#kept === undefined && kept.size === identity.size) {
      const [a, b] = await Promise.all([sha256Of(this.binary), sha256Of(this.path)]).catch(() => []);
      if (a !== undefined && a === b) {
        this.#kept = identity;
        return { kind: "proven", identity };
      }
    }
    if (this.#kept !== undefined && sameInode(this.#kept, identity)) return { kind: "proven", identity };
    return { kind: "trial", identity };
  }

  /**
   * Keeps the binary that just served (the file `served`, if it is still at the path) as
   * `<binary>.previous`. A no-op when it is kept already.
   */
  async keep(served: FileIdentity | undefined): Promise<"kept" | "already" | "moved"> {
    const now = await fileIdentity(this.binary);
    if (served === undefined || now === undefined || !sameInode(served, now)) return "moved";
    const kept = await fileIdentity(this.path);
    if (kept !== undefined && sameInode(kept, now)) {
      this.#kept = now;
      return "already";
    }
    if (this.#kept !== undefined && sameInode(this.#kept, now) && kept !== undefined) return "already";
    await this.#replace(this.binary, this.path);
    this.#kept = now;
    return "kept";
  }

  /** Puts the kept binary back at the path, in place of the one that failed; false with none kept. */
  async restore(): Promise<boolean> {
    if ((await fileIdentity(this.path)) === undefined) return false;
    await this.#replace(this.path, this.binary);
    this.#kept = await fileIdentity(this.binary);
    return true;
  }

  /** `to` becomes the file at `from` (a hard link, else a copy), renamed into place, durably. */
  async #replace(from: string, to: string): Promise<void> {
    const temp = join(dirname(to), `.${basename(to)}.keep-${process.pid}-${Date.now()}`);
    try {
      const source = await realpath(from);
      await link(source, temp).catch(async (error: unknown) => {
        // Another file system (a symlinked binary), or one without hard links: a copy holds too.
        const code = (error as NodeJS.ErrnoException).code;
        if (code !== "EXDEV" && code !== "EPERM" && code !== "ENOTSUP" && code !== "EMLINK") throw error;
        await copyFile(source, temp);
        const copy = await open(temp, "r");
        await copy.sync().finally(() => copy.close());
      });
      await rename(temp, to);
      // A rename onto a name of the same file does nothing and leaves the temporary name behind.
      await unlink(temp).catch(() => undefined);
      await syncDirectory(dirname(to));
    } catch (error) {
      await unlink(temp).catch(() => undefined);
      throw new PreviousBinaryError(`cannot make ${to} from ${from}: ${errorMessage(error)}`, {
        cause: error,
      });
    }
  }
}

function sameInode(a: FileIdentity, b: FileIdentity): boolean {
  return a.dev === b.dev && a.ino === b.ino;
}

async function sha256Of(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest("hex");
}
