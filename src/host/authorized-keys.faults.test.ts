import { rejected } from "../testing/thrown.js";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { AuthorizedKeys, type UserLookup } from "./authorized-keys.js";
import { PUBLIC_KEY_MARKER } from "../tasks/ssh-public-key.js";

/*
 * The error paths of AuthorizedKeys that a real file system will not produce for root (the
 * tests run as root, which no permission stops): an `open`, `mkdir`, `lstat` or a handle's
 * `chown`/`sync` failing with a given errno. A thin wrapper of `node:fs/promises` makes the next
 * such call on a path ending in a given name fail once; every other call goes through.
 */
interface Fault {
  readonly op: "open" | "mkdir" | "lstat" | "chown" | "sync";
  /** The last path component the call names (the code works through `/proc/self/fd/N/<name>`). */
  readonly name: string;
  readonly code: string;
  /** Runs on the real file system just before the call fails (e.g. someone else creates the dir). */
  readonly meanwhile?: () => Promise<void>;
}

const faults = vi.hoisted(() => ({ pending: [] as Fault[] }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const take = (op: Fault["op"], path: unknown): Fault | undefined => {
    const at = faults.pending.findIndex((f) => f.op === op && String(path).endsWith(`/${f.name}`));
    return at === -1 ? undefined : faults.pending.splice(at, 1)[0];
  };
  const fail = async (fault: Fault): Promise<never> => {
    await fault.meanwhile?.();
    throw Object.assign(new Error(`${fault.code}: injected`), { code: fault.code });
  };
  const wrapped = {
    ...real,
    open: async (path: string, ...rest: unknown[]) => {
      const fault = take("open", path);
      if (fault) return fail(fault);
      const handle = await (
        real.open as (...args: unknown[]) => Promise<import("node:fs/promises").FileHandle>
      )(path, ...rest);
      return new Proxy(handle, {
        get(target, key) {
          const value = Reflect.get(target, key) as unknown;
          if (typeof value !== "function") return value;
          if (key === "chown" || key === "sync") {
            return (...args: unknown[]) => {
              const handleFault = take(key, path);
              return handleFault
                ? fail(handleFault)
                : (value as (...a: unknown[]) => unknown).apply(target, args);
            };
          }
          return (value as (...a: unknown[]) => unknown).bind(target);
        },
      });
    },
    mkdir: (path: string, ...rest: unknown[]) => {
      const fault = take("mkdir", path);
      return fault ? fail(fault) : (real.mkdir as (...args: unknown[]) => unknown)(path, ...rest);
    },
    lstat: (path: string, ...rest: unknown[]) => {
      const fault = take("lstat", path);
      return fault ? fail(fault) : (real.lstat as (...args: unknown[]) => unknown)(path, ...rest);
    },
  };
  return { ...wrapped, default: wrapped };
});

const ALICE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIM3w4GVANxwykR9noGY7PCFNXEBbweA+ReD2IuJzgeUW alice@laptop";
const BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII1MS7iRqDbzkLOAf8AtxRMav662TwVJ6YS9npFc/qVR bob";

describe("AuthorizedKeys when the file system fails", () => {
  let root: string;
  let home: string;
  let sshDir: string;
  let file: string;
  let ak: AuthorizedKeys;

  beforeEach(async () => {
    faults.pending.length = 0;
    root = await mkdtemp(join(tmpdir(), "ak-faults-"));
    home = join(root, "ubuntu");
    await mkdir(home);
    sshDir = join(home, ".ssh");
    file = join(sshDir, "authorized_keys");
    const lookup: UserLookup = () =>
      Promise.resolve({ name: "ubuntu", home, uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 });
    ak = new AuthorizedKeys(lookup);
  });
  afterEach(async () => {
    expect(faults.pending).toEqual([]); // every injected fault was reached
    await rm(root, { recursive: true, force: true });
  });

  const seed = async (content: string): Promise<void> => {
    await mkdir(sshDir, { mode: 0o700 });
    await writeFile(file, content);
  };

  it("reports a ~/.ssh it cannot open (not a symlink, not absent) as a write error, with its cause", async () => {
    await seed(`${BOB}\n`);
    faults.pending.push({ op: "open", name: ".ssh", code: "EACCES" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual(["AuthorizedKeysWriteError", `cannot open ${sshDir}`]);
    expect(error.cause).toMatchObject({ code: "EACCES" });
    expect(await readFile(file, "utf8")).toBe(`${BOB}\n`);
  });

  it("refuses a ~/.ssh that loops (ELOOP) and calls it not a directory when lstat cannot tell", async () => {
    faults.pending.push(
      { op: "open", name: ".ssh", code: "ELOOP" },
      { op: "lstat", name: ".ssh", code: "EIO" },
    );
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual([
      "UnsafeAuthorizedKeysPathError",
      `${sshDir} is not a directory`,
    ]);
    expect(error.cause).toMatchObject({ code: "ELOOP" });
    // Nothing was created in place of the refused directory.
    expect(await readdir(home)).toEqual([]);
  });

  it("reports an authorized_keys it cannot read (not a symlink, not absent) as a write error", async () => {
    await seed(`${BOB}\n`);
    faults.pending.push({ op: "open", name: "authorized_keys", code: "EACCES" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual(["AuthorizedKeysWriteError", `cannot read ${file}`]);
    expect(error.cause).toMatchObject({ code: "EACCES" });
    expect(await readFile(file, "utf8")).toBe(`${BOB}\n`);
  });

  it("reports a ~/.ssh it cannot create, with its cause", async () => {
    faults.pending.push({ op: "mkdir", name: ".ssh", code: "EACCES" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual(["AuthorizedKeysWriteError", `cannot create ${sshDir}`]);
    expect(error.cause).toMatchObject({ code: "EACCES" });
    expect(await readdir(home)).toEqual([]);
  });

  it("writes into a ~/.ssh created by someone else meanwhile (mkdir answers EEXIST)", async () => {
    faults.pending.push({
      op: "mkdir",
      name: ".ssh",
      code: "EEXIST",
      meanwhile: () => mkdir(sshDir, { mode: 0o755 }).then(() => undefined),
    });
    await ak.reconcile("ubuntu", [ALICE]);
    expect(await readFile(file, "utf8")).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
  });

  it("says so when ~/.ssh vanished between its creation and its opening", async () => {
    faults.pending.push({ op: "mkdir", name: ".ssh", code: "EEXIST" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual([
      "AuthorizedKeysWriteError",
      `cannot create ${sshDir}: it vanished`,
    ]);
  });

  it("reports a ~/.ssh it created but could not hand to the user, with its cause", async () => {
    faults.pending.push({ op: "chown", name: ".ssh", code: "EPERM" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual(["AuthorizedKeysWriteError", `cannot create ${sshDir}`]);
    expect(error.cause).toMatchObject({ code: "EPERM" });
    expect(await readdir(sshDir)).toEqual([]);
  });

  it("reports a failed fsync of ~/.ssh after the rename, naming the directory and the cause", async () => {
    await seed(`${BOB}\n`);
    faults.pending.push({ op: "sync", name: ".ssh", code: "EIO" });
    const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
    expect([error.name, error.message]).toEqual([
      "AuthorizedKeysWriteError",
      `cannot sync ${sshDir}: EIO: injected`,
    ]);
    expect(error.cause).toMatchObject({ code: "EIO" });
    // The new content is in place; only its durability is in doubt, and the caller is told.
    expect(await readFile(file, "utf8")).toBe(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
  });
});
