import { constants } from "node:fs";
import { lstat, mkdir, open, readFile, rename, unlink, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { errorMessage } from "../errors/error-message.js";
import {
  canonicalizePublicKey,
  InvalidPublicKeyError,
  isShimEntry,
  publicKeyFingerprint,
} from "../tasks/ssh-public-key.js";

/** The user is not in the passwd database. */
export class UnknownUserError extends Error {
  override readonly name = "UnknownUserError";
}

/** `~/.ssh` or `authorized_keys` is a symlink or not what it should be; the shim will not follow it. */
export class UnsafeAuthorizedKeysPathError extends Error {
  override readonly name = "UnsafeAuthorizedKeysPathError";
}

/** Reading or atomically replacing `authorized_keys` failed; the old file is untouched. */
export class AuthorizedKeysWriteError extends Error {
  override readonly name = "AuthorizedKeysWriteError";
}

/** Reconciling one user's keys failed (an entry of the `AggregateError` of {@link HostKeysReconciler}). */
export class UserKeysReconcileError extends Error {
  override readonly name = "UserKeysReconcileError";
  constructor(
    readonly user: string,
    options: ErrorOptions,
  ) {
    super(
      `reconcile authorized_keys of ${user}: ${options.cause === undefined ? "failed" : errorMessage(options.cause)}`,
      options,
    );
  }
}

/** A host account, as far as `authorized_keys` cares. */
export interface UserAccount {
  readonly name: string;
  readonly home: string;
  readonly uid: number;
  readonly gid: number;
}

/** Finds a host account by name; rejects with `UnknownUserError` when there is none. */
export type UserLookup = (name: string) => Promise<UserAccount>;

/**
 * A {@link UserLookup} over a passwd file (`name:password:uid:gid:gecos:home:shell`), read on every
 * call so accounts added after startup are found. Comments and malformed lines are skipped.
 */
export function passwdUserLookup(passwdPath = "/etc/passwd"): UserLookup {
  return async function lookupInPasswd(name: string): Promise<UserAccount> {
    const content = await readFile(passwdPath, "utf8");
    for (const line of content.split("\n")) {
      const fields = line.split(":");
      if (fields.length < 7 || fields[0] !== name) continue;
      // Stryker disable next-line StringLiteral: fields.length >= 7 just above, so no default ever applies
      const [, , uid = "", gid = "", , home = ""] = fields;
      if (!/^\d+$/.test(uid) || !/^\d+$/.test(gid) || !home.startsWith("/")) continue;
      return { name, home, uid: Number(uid), gid: Number(gid) };
    }
    throw new UnknownUserError(`unknown user: ${name}`);
  };
}

const NEWLINE = 0x0a;

/**
 * The new `authorized_keys` content: every line that is not a shim entry, byte for byte and in
 * order, then `entries` (already canonical), one per line. A final line without a newline keeps
 * lacking it unless entries follow it.
 */
export function composeAuthorizedKeys(current: Buffer, entries: readonly string[]): Buffer {
  const lines: Buffer[] = [];
  for (let start = 0; start < current.length;) {
    const end = current.indexOf(NEWLINE, start);
    lines.push(current.subarray(start, end === -1 ? current.length : end));
    start = end === -1 ? current.length : end + 1;
  }
  const kept = lines.filter((line) => !isShimEntry(line.toString("latin1")));
  // Stryker disable next-line ConditionalExpression,EqualityOperator: no lines means empty content, never unterminated
  const lastLineKept = lines.length > 0 && kept.at(-1) === lines.at(-1);
  // Stryker disable next-line ConditionalExpression,EqualityOperator: empty content has no lines, so no part to end
  const unterminated = current.length > 0 && current[current.length - 1] !== NEWLINE;
  const parts = [...kept, ...entries.map((entry) => Buffer.from(entry, "utf8"))];
  const out: Buffer[] = [];
  parts.forEach((part, i) => {
    out.push(part);
    const last = i === parts.length - 1;
    if (!last || !(unterminated && lastLineKept && entries.length === 0)) out.push(Buffer.of(NEWLINE));
  });
  return Buffer.concat(out);
}

type CurrentFile =
  { readonly exists: false } | { readonly exists: true; readonly content: Buffer; readonly mode: number };

/**
 * A path that names `name` inside the directory held open by `dir`, whatever has happened to
 * the directory's path since: `/proc/self/fd/N` is the kernel's link to the open directory
 * itself, so `/proc/self/fd/N/name` is resolved like `openat(N, name)`. Node has no `openat`,
 * `renameat` or `mkdirat`; this gives the same guarantee with its path-based calls.
 */
function at(dir: FileHandle, name: string): string {
  return `/proc/self/fd/${dir.fd}/${name}`;
}

const DIR_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;

/** Owned by the user or by root: anything else in a user's ~/.ssh was put there to trick root. */
function checkOwner(uid: number, account: UserAccount, what: string): void {
  if (uid !== account.uid && uid !== 0) {
    throw new UnsafeAuthorizedKeysPathError(`${what} is owned by uid ${uid}, not by ${account.name}`);
  }
}

/** Opens the user's home (its path is the administrator's, so a symlink there is followed). */
async function openHome(account: UserAccount): Promise<FileHandle> {
  try {
    return await open(account.home, constants.O_RDONLY | constants.O_DIRECTORY);
  } catch (error) {
    throw new AuthorizedKeysWriteError(`cannot open the home ${account.home} of ${account.name}`, {
      cause: error,
    });
  }
}

/**
 * Opens `~/.ssh` relative to the held home, never through a symlink; undefined when absent.
 * From here on every operation works on this open directory: swapping `~/.ssh` for a symlink
 * afterwards changes nothing for the shim (it keeps writing into the directory it opened).
 */
async function openSshDir(
  home: FileHandle,
  sshDir: string,
  account: UserAccount,
): Promise<FileHandle | undefined> {
  let handle: FileHandle;
  try {
    handle = await open(at(home, ".ssh"), DIR_FLAGS);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    // With O_DIRECTORY, Linux answers a symlink with ENOTDIR; lstat only words the message.
    if (code === "ELOOP" || code === "ENOTDIR") {
      const link = (await lstat(at(home, ".ssh")).catch(() => undefined))?.isSymbolicLink() ?? false;
      throw new UnsafeAuthorizedKeysPathError(`${sshDir} is ${link ? "a symlink" : "not a directory"}`, {
        cause: error,
      });
    }
    throw new AuthorizedKeysWriteError(`cannot open ${sshDir}`, { cause: error });
  }
  try {
    checkOwner((await handle.stat()).uid, account, sshDir);
    return handle;
  } catch (error) {
    await handle.close();
    throw error;
  }
}

async function readCurrent(ssh: FileHandle, path: string, account: UserAccount): Promise<CurrentFile> {
  let handle: FileHandle;
  try {
    // O_NONBLOCK: a FIFO planted there must not hang the shim.
    handle = await open(
      at(ssh, "authorized_keys"),
      constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK,
    );
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return { exists: false };
    if (code === "ELOOP") throw new UnsafeAuthorizedKeysPathError(`${path} is a symlink`, { cause: error });
    throw new AuthorizedKeysWriteError(`cannot read ${path}`, { cause: error });
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw new UnsafeAuthorizedKeysPathError(`${path} is not a regular file`);
    checkOwner(stat.uid, account, path);
    // A hard link to a file elsewhere: its lines would be copied into a file the user owns.
    if (stat.nlink !== 1) throw new UnsafeAuthorizedKeysPathError(`${path} has ${stat.nlink} hard links`);
    return { exists: true, content: await handle.readFile(), mode: stat.mode & 0o7777 };
  } finally {
    await handle.close();
  }
}

async function createSshDir(home: FileHandle, sshDir: string, account: UserAccount): Promise<FileHandle> {
  try {
    // Stryker disable next-line ObjectLiteral: the chmod(0o700) below sets the same mode before anything is written
    await mkdir(at(home, ".ssh"), { mode: 0o700 });
  } catch (error) {
    // Created meanwhile (by the user): open what is there, with the same checks.
    if ((error as NodeJS.ErrnoException).code !== "EEXIST")
      throw new AuthorizedKeysWriteError(`cannot create ${sshDir}`, { cause: error });
  }
  const handle = await openSshDir(home, sshDir, account);
  if (!handle) throw new AuthorizedKeysWriteError(`cannot create ${sshDir}: it vanished`);
  try {
    // mkdir's mode is filtered by the umask; sshd wants exactly 0700.
    await handle.chmod(0o700);
    await handle.chown(account.uid, account.gid);
    await home.sync();
    return handle;
  } catch (error) {
    await handle.close();
    throw new AuthorizedKeysWriteError(`cannot create ${sshDir}`, { cause: error });
  }
}

/**
 * The shim's entries in one user's `~/.ssh/authorized_keys` (marked lines it owns). The file is
 * only ever replaced atomically, so a shim killed mid-update leaves the old file or the new one,
 * never a truncated one (S8), and lines the shim did not write are kept byte for byte.
 */
export class AuthorizedKeys {
  constructor(
    private readonly lookup: UserLookup,
    private readonly log?: (msg: string, fields?: object) => void,
  ) {}

  /**
   * Makes the shim entries of `user` exactly `keys` (canonicalised, deduplicated by fingerprint;
   * invalid keys are logged and skipped). Nothing is written when the content is unchanged, and a
   * missing file is not created empty. A file that held only shim entries becomes empty: it
   * existed, so writing what remains is the honest result, and it is done atomically.
   *
   * @throws UnknownUserError from the lookup, UnsafeAuthorizedKeysPathError when `~/.ssh` or the
   *   file is a symlink, AuthorizedKeysWriteError when reading or replacing the file failed.
   */
  async reconcile(user: string, keys: readonly string[], options: ReconcileOptions = {}): Promise<void> {
    const account = await this.lookup(user);
    const sshDir = join(account.home, ".ssh");
    const path = join(sshDir, "authorized_keys");
    const home = await openHome(account);
    let ssh: FileHandle | undefined;
    try {
      ssh = await openSshDir(home, sshDir, account);
      const current: CurrentFile = ssh ? await readCurrent(ssh, path, account) : { exists: false };
      const kept =
        options.keepExisting && current.exists
          ? current.content
              .toString("utf8")
              .split("\n")
              .filter((line) => isShimEntry(line))
          : [];
      const entries = this.entriesFor(user, [...kept, ...keys]);
      const next = composeAuthorizedKeys(current.exists ? current.content : Buffer.alloc(0), entries);
      if (current.exists ? next.equals(current.content) : next.length === 0) return;
      ssh ??= await createSshDir(home, sshDir, account);
      await replaceAtomically(ssh, sshDir, path, next, current.exists ? current.mode : 0o600, account);
    } finally {
      await ssh?.close().catch(() => undefined);
      await home.close().catch(() => undefined);
    }
  }

  private entriesFor(user: string, keys: readonly string[]): string[] {
    const entries: string[] = [];
    const seen = new Set<string>();
    for (const key of keys) {
      let entry: string;
      let fingerprint: string;
      try {
        entry = canonicalizePublicKey(key);
        fingerprint = publicKeyFingerprint(key);
      } catch (error) {
        if (!(error instanceof InvalidPublicKeyError)) throw error;
        this.log?.("skipping invalid host SSH key", { user, error: error.message });
        continue;
      }
      if (seen.has(fingerprint)) continue;
      seen.add(fingerprint);
      entries.push(entry);
    }
    return entries;
  }
}

async function replaceAtomically(
  ssh: FileHandle,
  sshDir: string,
  path: string,
  content: Buffer,
  mode: number,
  account: UserAccount,
): Promise<void> {
  // A fixed name, so a temp file left by a killed shim is reused; every step is relative to the
  // open ~/.ssh, and O_EXCL|O_NOFOLLOW refuse whatever the user may have planted under that name.
  const temp = at(ssh, "authorized_keys.tmp");
  let handle: FileHandle | undefined;
  try {
    await unlink(temp).catch((error: unknown) => {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    });
    handle = await open(
      temp,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      0o600,
    );
    await handle.writeFile(content);
    await handle.chmod(mode);
    await handle.chown(account.uid, account.gid);
    await handle.sync();
    await handle.close();
    handle = undefined;
    await rename(temp, at(ssh, "authorized_keys"));
  } catch (error) {
    await handle?.close().catch(() => undefined);
    await unlink(temp).catch(() => undefined);
    throw new AuthorizedKeysWriteError(`cannot replace ${path}: ${describe(error)}`, { cause: error });
  }
  try {
    // The directory fsync goes through the held handle, not a path (state/durable-write.ts's
    // syncDirectory opens one): by now `~/.ssh` may name another directory.
    await ssh.sync();
  } catch (error) {
    throw new AuthorizedKeysWriteError(`cannot sync ${sshDir}: ${describe(error)}`, { cause: error });
  }
}

/** An error's message without the /proc/self/fd path it may name (meaningless to an operator). */
function describe(error: unknown): string {
  return errorMessage(error).replace(/\/proc\/self\/fd\/\d+\//g, "");
}

/** How a reconcile treats the shim entries already in the file. */
export interface ReconcileOptions {
  /**
   * Keep every shim entry already present and only add: used while a task whose keys cannot be
   * known (its state file was lost) is alive, since leaking a key beats revoking a live one.
   */
  readonly keepExisting?: boolean;
}

/**
 * Reconciles host keys for many users, one reconcile at a time: each `authorized_keys` update is a
 * read-modify-write, and two interleaved ones would lose an entry. The map is the complete truth
 * (the union of the host keys of every live task, per user; a user mapped to no keys loses all
 * shim entries).
 */
export class HostKeysReconciler {
  private tail: Promise<void> = Promise.resolve();

  constructor(private readonly ak: AuthorizedKeys) {}

  /**
   * Reconciles every user in `keysByUser`, after any reconcile already running.
   *
   * @throws AggregateError of {@link UserKeysReconcileError}s, one per user that failed; the other
   *   users are still reconciled.
   */
  reconcile(
    keysByUser: ReadonlyMap<string, readonly string[]> | (() => ReadonlyMap<string, readonly string[]>),
    options: ReconcileOptions = {},
  ): Promise<void> {
    // A function is evaluated when this reconcile's turn comes, so it never writes a stale set.
    const run = this.tail.then(() =>
      this.reconcileAll(typeof keysByUser === "function" ? keysByUser() : keysByUser, options),
    );
    this.tail = run.catch(() => undefined);
    return run;
  }

  private async reconcileAll(
    keysByUser: ReadonlyMap<string, readonly string[]>,
    options: ReconcileOptions,
  ): Promise<void> {
    const errors: UserKeysReconcileError[] = [];
    for (const [user, keys] of keysByUser) {
      try {
        await this.ak.reconcile(user, keys, options);
      } catch (error) {
        errors.push(new UserKeysReconcileError(user, { cause: error }));
      }
    }
    if (errors.length > 0) {
      throw new AggregateError(
        errors,
        `failed to reconcile authorized_keys of ${errors.map((e) => e.user).join(", ")}`,
      );
    }
  }
}
