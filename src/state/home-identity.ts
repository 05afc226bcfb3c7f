import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { FileTooLargeError, NotRegularFileError, readBoundedFile } from "./bounded-read.js";
import { writeFileDurably } from "./durable-write.js";
import { errorMessage } from "../errors/error-message.js";

/** The file in the home that holds its identity (the owner label of its containers). */
export const HOME_ID_FILE = ".taskshim-home-id";

const VALID_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** The most of the identity file that is read: an identity is at most 128 characters. */
export const HOME_ID_MAX_BYTES = 4096;

/** The home's identity file exists but cannot be used. */
export class HomeIdentityError extends Error {
  override readonly name = "HomeIdentityError";
}

/**
 * The identity of a home: created (a random UUID, written durably) at the first start on it and
 * read at every later one. It is written as the owner label of every container the shim
 * creates, so that shims with different homes on one engine tell their containers apart.
 *
 * A damaged file is never replaced silently: a new identity would make every container of
 * the old one foreign, so the operator decides.
 */
export async function loadHomeIdentity(home: string): Promise<string> {
  const path = join(home, HOME_ID_FILE);
  let text: string;
  try {
    // Never through a symlink nor by a blocking open: a FIFO here held the start for ever.
    text = await readBoundedFile(path, HOME_ID_MAX_BYTES);
  } catch (error) {
    if (error instanceof NotRegularFileError || error instanceof FileTooLargeError) {
      throw new HomeIdentityError(
        `the home identity ${error.message}: restore it, or delete it to give this home a new identity`,
        { cause: error },
      );
    }
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") {
      throw new HomeIdentityError(`cannot read the home identity ${path}: ${errorMessage(error)}`, {
        cause: error,
      });
    }
    const id = randomUUID();
    await writeFileDurably(path, `${id}\n`, 0o644);
    return id;
  }
  const id = text.trim();
  if (!VALID_ID.test(id)) {
    throw new HomeIdentityError(
      `the home identity ${path} is damaged: restore it, or delete it to give this home a new identity`,
    );
  }
  return id;
}
