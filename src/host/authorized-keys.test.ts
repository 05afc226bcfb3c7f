import { rejected } from "../testing/thrown.js";
import { execFileSync } from "node:child_process";
import { renameSync, symlinkSync } from "node:fs";
import {
  chmod,
  chown,
  link,
  lstat,
  mkdir,
  mkdtemp,
  readFile,
  readdir,
  rm,
  stat,
  symlink,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  AuthorizedKeys,
  AuthorizedKeysWriteError,
  HostKeysReconciler,
  UnknownUserError,
  UnsafeAuthorizedKeysPathError,
  UserKeysReconcileError,
  composeAuthorizedKeys,
  passwdUserLookup,
  type UserAccount,
  type UserLookup,
} from "./authorized-keys.js";
import { PUBLIC_KEY_MARKER } from "../tasks/ssh-public-key.js";

// Real keys made with ssh-keygen (ssh-public-key.test.ts parses and fingerprints more of them).
const ALICE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIM3w4GVANxwykR9noGY7PCFNXEBbweA+ReD2IuJzgeUW alice@laptop";
const BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII1MS7iRqDbzkLOAf8AtxRMav662TwVJ6YS9npFc/qVR bob";
const CAROL =
  "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBICmPe7vpeT0DQdCfHGV2FrDU7HJkZOuVtDyilCgwf3tF88QflKvDddmTs+Yi9LjvALdJBoCNPPULWSXxuEWjAg= carol";

describe("composeAuthorizedKeys", () => {
  it("keeps an unterminated last line unterminated unless entries follow", () => {
    expect(composeAuthorizedKeys(Buffer.from("a\nb"), []).toString()).toBe("a\nb");
    expect(composeAuthorizedKeys(Buffer.from("a\nb"), ["k"]).toString()).toBe("a\nb\nk\n");
    expect(composeAuthorizedKeys(Buffer.from(`a\nx ${PUBLIC_KEY_MARKER}`), []).toString()).toBe("a\n");
    expect(composeAuthorizedKeys(Buffer.from(""), []).length).toBe(0);
    expect(composeAuthorizedKeys(Buffer.from("\n\n"), []).toString()).toBe("\n\n");
  });

  it("looks at the very last line, whatever comes before it", () => {
    expect(composeAuthorizedKeys(Buffer.from("a\nb\nc"), []).toString()).toBe("a\nb\nc");
    expect(composeAuthorizedKeys(Buffer.from(`a\nb\nx ${PUBLIC_KEY_MARKER}`), []).toString()).toBe("a\nb\n");
    expect(composeAuthorizedKeys(Buffer.from(""), ["k"]).toString()).toBe("k\n");
  });
});

describe("passwdUserLookup", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "passwd-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("finds users and rejects unknown ones", async () => {
    const path = join(dir, "passwd");
    await writeFile(
      path,
      [
        "root:x:0:0:root:/root:/bin/bash",
        "# a comment",
        "broken:line",
        "ubuntu:x:1000:1001:Ubuntu,,,:/home/ubuntu:/bin/bash",
        "",
      ].join("\n"),
    );
    const lookup = passwdUserLookup(path);
    await expect(lookup("ubuntu")).resolves.toEqual({
      name: "ubuntu",
      home: "/home/ubuntu",
      uid: 1000,
      gid: 1001,
    });
    await expect(lookup("root")).resolves.toMatchObject({ uid: 0, home: "/root" });
    await expect(lookup("ghost")).rejects.toBeInstanceOf(UnknownUserError);
    await expect(lookup("broken")).rejects.toBeInstanceOf(UnknownUserError);
  });

  it("skips lines whose uid, gid, home or field count is wrong, and names the missing user", async () => {
    const path = join(dir, "passwd");
    await writeFile(
      path,
      [
        "other:x:7:7::/home/other:/bin/sh",
        "short:x:1:1::/home/short",
        "baduid:x:1a:1::/home/baduid:/bin/sh",
        "baduid:x:a1:1::/home/baduid:/bin/sh",
        "badgid:x:1:1a::/home/badgid:/bin/sh",
        "badgid:x:1:a1::/home/badgid:/bin/sh",
        "relhome:x:1:1::home/relhome:/bin/sh",
        "relhome:x:2:2::/home/relhome:/bin/sh",
      ].join("\n"),
    );
    const lookup = passwdUserLookup(path);
    for (const name of ["short", "baduid", "badgid"]) {
      const error = (await lookup(name).catch((e: unknown) => e)) as Error;
      expect([error.name, error.message]).toEqual(["UnknownUserError", `unknown user: ${name}`]);
    }
    await expect(lookup("relhome")).resolves.toEqual({
      name: "relhome",
      home: "/home/relhome",
      uid: 2,
      gid: 2,
    });
    await expect(lookup("other")).resolves.toMatchObject({ uid: 7 });
  });

  it("reads /etc/passwd by default", async () => {
    await expect(passwdUserLookup()("root")).resolves.toMatchObject({ name: "root", uid: 0, gid: 0 });
  });
});

describe("AuthorizedKeys.reconcile", () => {
  let root: string;
  let home: string;
  let file: string;
  let lookup: UserLookup;
  let logged: string[];
  let ak: AuthorizedKeys;
  const uid = process.getuid?.() ?? 0;
  const gid = process.getgid?.() ?? 0;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), "ak-"));
    home = join(root, "ubuntu");
    await mkdir(home);
    file = join(home, ".ssh", "authorized_keys");
    const accounts: Record<string, UserAccount> = { ubuntu: { name: "ubuntu", home, uid, gid } };
    lookup = (name) => {
      const account = accounts[name];
      return account
        ? Promise.resolve(account)
        : Promise.reject(new UnknownUserError(`unknown user: ${name}`));
    };
    logged = [];
    ak = new AuthorizedKeys(lookup, (msg) => logged.push(msg));
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const seed = async (content: string | Buffer, mode = 0o600): Promise<void> => {
    await mkdir(join(home, ".ssh"), { recursive: true, mode: 0o700 });
    await writeFile(file, content);
    await chmod(file, mode);
  };
  const read = () => readFile(file, "utf8");

  it("creates ~/.ssh (0700) and the file (0600) when there are keys", async () => {
    await ak.reconcile("ubuntu", [ALICE]);
    expect(await read()).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
    const dirStat = await stat(join(home, ".ssh"));
    expect(dirStat.mode & 0o777).toBe(0o700);
    expect(dirStat.uid).toBe(uid);
    const fileStat = await stat(file);
    expect(fileStat.mode & 0o777).toBe(0o600);
    expect([fileStat.uid, fileStat.gid]).toEqual([uid, gid]);
    expect(await readdir(join(home, ".ssh"))).toEqual(["authorized_keys"]);
  });

  it("creates nothing when there is nothing to write", async () => {
    await ak.reconcile("ubuntu", []);
    await expect(lstat(join(home, ".ssh"))).rejects.toMatchObject({ code: "ENOENT" });
    await ak.reconcile("ubuntu", ["not a key"]);
    await expect(lstat(join(home, ".ssh"))).rejects.toMatchObject({ code: "ENOENT" });
    expect(logged).toEqual(["skipping invalid host SSH key"]);
  });

  it("keeps unmarked lines byte-identical and in order, with the original mode", async () => {
    const original = Buffer.concat([
      Buffer.from(`# managed by hand\n${BOB}\n\ncommand="backup" ${CAROL}\r\n`),
      Buffer.from([0xff, 0xfe, 0x20, 0x6b, 0x0a]), // not UTF-8
      Buffer.from(
        `${BOB} again # added by dstack\n  trailing spaces  \n${ALICE} ${PUBLIC_KEY_MARKER}\nlast line`,
      ),
    ]);
    await seed(original, 0o640);
    await ak.reconcile("ubuntu", [ALICE, BOB]);
    const expectedKept = original.subarray(0, original.indexOf(`${ALICE} ${PUBLIC_KEY_MARKER}`));
    const after = await readFile(file);
    expect(after.subarray(0, expectedKept.length).equals(expectedKept)).toBe(true);
    expect(after.subarray(expectedKept.length).toString()).toBe(
      `last line\n${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n`,
    );
    expect((await stat(file)).mode & 0o777).toBe(0o640);

    await ak.reconcile("ubuntu", []);
    // The unterminated last line gained its newline when entries were appended after it.
    const unmarked = Buffer.concat([expectedKept, Buffer.from("last line\n")]);
    expect((await readFile(file)).equals(unmarked)).toBe(true);
  });

  it("never claims the server's '# added by dstack' keys", async () => {
    await seed(`${ALICE} # added by dstack\n`);
    await ak.reconcile("ubuntu", [ALICE]);
    await ak.reconcile("ubuntu", []);
    expect(await read()).toBe(`${ALICE} # added by dstack\n`);
  });

  it("deduplicates by fingerprint and skips invalid keys", async () => {
    await ak.reconcile("ubuntu", [
      ALICE,
      ALICE.replace("alice@laptop", "same key"),
      `no-pty ${BOB}`,
      `${ALICE}\n${BOB}`,
      BOB,
    ]);
    expect(await read()).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n`);
    expect(logged).toHaveLength(2);
  });

  it("does not rewrite an unchanged file", async () => {
    await seed(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
    const before = await stat(file);
    await ak.reconcile("ubuntu", [ALICE]);
    expect((await stat(file)).ino).toBe(before.ino);
  });

  it("empties a file that held only shim entries, rather than deleting it", async () => {
    await seed(`${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n`);
    await ak.reconcile("ubuntu", []);
    expect(await read()).toBe("");
  });

  it("refuses symlinks for the file and for ~/.ssh", async () => {
    const victim = join(root, "victim");
    await writeFile(victim, "secret\n");
    await mkdir(join(home, ".ssh"), { mode: 0o700 });
    await symlink(victim, file);
    await expect(ak.reconcile("ubuntu", [ALICE])).rejects.toBeInstanceOf(UnsafeAuthorizedKeysPathError);
    await rm(join(home, ".ssh"), { recursive: true });
    const elsewhere = join(root, "elsewhere");
    await mkdir(elsewhere);
    await symlink(elsewhere, join(home, ".ssh"));
    await expect(ak.reconcile("ubuntu", [ALICE])).rejects.toBeInstanceOf(UnsafeAuthorizedKeysPathError);
    expect(await readFile(victim, "utf8")).toBe("secret\n");
    expect(await readdir(elsewhere)).toEqual([]);
  });

  it("replaces a leftover temp file, even a planted symlink, without writing through it", async () => {
    const victim = join(root, "victim");
    await writeFile(victim, "secret\n");
    await seed(`${BOB}\n`);
    await symlink(victim, join(home, ".ssh", "authorized_keys.tmp"));
    await ak.reconcile("ubuntu", [ALICE]);
    expect(await read()).toBe(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
    expect(await readFile(victim, "utf8")).toBe("secret\n");
    expect(await readdir(join(home, ".ssh"))).toEqual(["authorized_keys"]);
  });

  it("leaves the old file and no temp file when the write fails", async () => {
    await seed(`${BOB}\n`);
    const broken = new AuthorizedKeys(() => Promise.resolve({ name: "ubuntu", home, uid: 2 ** 33, gid }));
    await expect(broken.reconcile("ubuntu", [ALICE])).rejects.toBeInstanceOf(AuthorizedKeysWriteError);
    expect(await read()).toBe(`${BOB}\n`);
    expect(await readdir(join(home, ".ssh"))).toEqual(["authorized_keys"]);
  });

  it("refuses a hard-linked file and a file owned by someone else, and never blocks on a FIFO", async () => {
    const victim = join(root, "victim");
    await writeFile(victim, "secret line\n");
    await mkdir(join(home, ".ssh"), { mode: 0o700 });
    await link(victim, file);
    await expect(ak.reconcile("ubuntu", [ALICE])).rejects.toThrow(/hard links/);
    await rm(file);
    await writeFile(file, `${BOB}\n`);
    await chown(file, 54321, 54321);
    await expect(ak.reconcile("ubuntu", [ALICE])).rejects.toThrow(/owned by uid 54321/);
    await rm(file);
    execFileSync("mkfifo", [file]);
    await expect(ak.reconcile("ubuntu", [ALICE])).rejects.toBeInstanceOf(UnsafeAuthorizedKeysPathError);
    expect(await readFile(victim, "utf8")).toBe("secret line\n");
  });

  it("keeps writing into the ~/.ssh it opened when the path is swapped for a symlink meanwhile", async () => {
    const victimDir = join(root, "victim-dir");
    await mkdir(victimDir);
    await writeFile(join(victimDir, "authorized_keys"), "victim\n");
    await seed(`${BOB}\n`);
    // The swap lands somewhere in the reconcile (before the open of ~/.ssh: refused as a
    // symlink; after it: written into the opened directory); never in the victim.
    const swapping = new AuthorizedKeys(() => {
      setImmediate(() => {
        renameSync(join(home, ".ssh"), join(home, ".ssh-real"));
        symlinkSync(victimDir, join(home, ".ssh"));
      });
      return Promise.resolve({ name: "ubuntu", home, uid, gid });
    });
    await swapping.reconcile("ubuntu", [ALICE]).catch(() => undefined);
    expect(await readFile(join(victimDir, "authorized_keys"), "utf8")).toBe("victim\n");
    expect(await readdir(victimDir)).toEqual(["authorized_keys"]);
  });

  it("propagates an unknown user", async () => {
    await expect(ak.reconcile("ghost", [ALICE])).rejects.toBeInstanceOf(UnknownUserError);
  });

  describe("refusals, word for word", () => {
    it("names a symlinked or non-directory ~/.ssh and keeps the cause", async () => {
      await symlink(root, join(home, ".ssh"));
      const link = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect([link.name, link.message]).toEqual([
        "UnsafeAuthorizedKeysPathError",
        `${home}/.ssh is a symlink`,
      ]);
      expect(link.cause).toMatchObject({ code: "ENOTDIR" });
      await rm(join(home, ".ssh"));
      await writeFile(join(home, ".ssh"), "a file\n");
      const notDir = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect([notDir.name, notDir.message]).toEqual([
        "UnsafeAuthorizedKeysPathError",
        `${home}/.ssh is not a directory`,
      ]);
      expect(await readFile(join(home, ".ssh"), "utf8")).toBe("a file\n");
    });

    it("names a ~/.ssh owned by someone else", async () => {
      await mkdir(join(home, ".ssh"), { mode: 0o700 });
      await chown(join(home, ".ssh"), 54321, 54321);
      const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect([error.name, error.message]).toEqual([
        "UnsafeAuthorizedKeysPathError",
        `${home}/.ssh is owned by uid 54321, not by ubuntu`,
      ]);
      expect(await readdir(join(home, ".ssh"))).toEqual([]);
    });

    it("accepts a ~/.ssh and a file owned by the user (not root)", async () => {
      const owned = new AuthorizedKeys(() =>
        Promise.resolve({ name: "ubuntu", home, uid: 54321, gid: 54322 }),
      );
      await seed(`${BOB}\n`);
      await chown(join(home, ".ssh"), 54321, 54322);
      await chown(file, 54321, 54322);
      await owned.reconcile("ubuntu", [ALICE]);
      expect(await read()).toBe(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      expect(await stat(file)).toMatchObject({ uid: 54321, gid: 54322 });
    });

    it("names a symlinked file, a non-regular one and a hard-linked one", async () => {
      await mkdir(join(home, ".ssh"), { mode: 0o700 });
      await symlink(join(root, "nowhere"), file);
      const symlinked = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect([symlinked.name, symlinked.message]).toEqual([
        "UnsafeAuthorizedKeysPathError",
        `${file} is a symlink`,
      ]);
      expect(symlinked.cause).toMatchObject({ code: "ELOOP" });
      await rm(file);
      await mkdir(file);
      const dir = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect([dir.name, dir.message]).toEqual([
        "UnsafeAuthorizedKeysPathError",
        `${file} is not a regular file`,
      ]);
      await rm(file, { recursive: true });
      await writeFile(join(root, "victim"), "x\n");
      await link(join(root, "victim"), file);
      const linked = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect(linked.message).toBe(`${file} has 2 hard links`);
    });

    it("writes into an existing empty ~/.ssh", async () => {
      await mkdir(join(home, ".ssh"), { mode: 0o711 });
      await ak.reconcile("ubuntu", [ALICE]);
      expect(await read()).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      // An existing ~/.ssh is the user's: its mode is left alone.
      expect((await stat(join(home, ".ssh"))).mode & 0o777).toBe(0o711);
    });

    it("names a failed replace without the /proc/self/fd path, and keeps the cause", async () => {
      await seed(`${BOB}\n`);
      // A directory where the temp file goes cannot be unlinked: the write stops there.
      await mkdir(join(home, ".ssh", "authorized_keys.tmp"));
      const error = await rejected(ak.reconcile("ubuntu", [ALICE]));
      expect(error.name).toBe("AuthorizedKeysWriteError");
      expect(error.message).toMatch(
        new RegExp(
          `^cannot replace ${file.replace(/[.]/g, "\\.")}: EISDIR: .*, unlink 'authorized_keys\\.tmp'$`,
        ),
      );
      expect(error.cause).toMatchObject({ code: "EISDIR" });
      expect(await read()).toBe(`${BOB}\n`);
    });

    it("names the home it cannot open", async () => {
      const homeless = new AuthorizedKeys(() =>
        Promise.resolve({ name: "ubuntu", home: join(root, "missing"), uid, gid }),
      );
      const error = await rejected(homeless.reconcile("ubuntu", [ALICE]));
      expect([error.name, error.message]).toEqual([
        "AuthorizedKeysWriteError",
        `cannot open the home ${join(root, "missing")} of ubuntu`,
      ]);
      expect(error.cause).toMatchObject({ code: "ENOENT" });
    });

    it("logs the user and the reason of a skipped key", async () => {
      const fields: object[] = [];
      const logging = new AuthorizedKeys(lookup, (_msg, f) => fields.push(f ?? {}));
      await logging.reconcile("ubuntu", ["ssh-foo AAAA"]);
      expect(fields).toEqual([{ user: "ubuntu", error: 'unsupported public key type "ssh-foo"' }]);
    });

    it("names the error classes", () => {
      expect(new UnknownUserError("x").name).toBe("UnknownUserError");
      expect(new AuthorizedKeysWriteError("x").name).toBe("AuthorizedKeysWriteError");
      expect(new UnsafeAuthorizedKeysPathError("x").name).toBe("UnsafeAuthorizedKeysPathError");
      const wrapped = new UserKeysReconcileError("bob", { cause: new Error("disk on fire") });
      expect([wrapped.name, wrapped.message]).toEqual([
        "UserKeysReconcileError",
        "reconcile authorized_keys of bob: disk on fire",
      ]);
      expect(new UserKeysReconcileError("bob", {}).message).toBe("reconcile authorized_keys of bob: failed");
    });
  });

  describe("keepExisting (a degraded task lives: only add, never revoke)", () => {
    it("keeps every shim entry already present and adds the new keys once", async () => {
      await seed(`ssh-ed25519 AAAA by-hand\n${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n`);
      await ak.reconcile("ubuntu", [CAROL, ALICE], { keepExisting: true });
      expect(await read()).toBe(
        `ssh-ed25519 AAAA by-hand\n${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n${CAROL} ${PUBLIC_KEY_MARKER}\n`,
      );
      // Asked for no key at all, it still revokes nothing.
      await ak.reconcile("ubuntu", [], { keepExisting: true });
      expect(await read()).toContain(`${BOB} ${PUBLIC_KEY_MARKER}`);
      expect(await read()).toContain(`${CAROL} ${PUBLIC_KEY_MARKER}`);
      // Without it, the set is exact again.
      await ak.reconcile("ubuntu", [BOB]);
      expect(await read()).toBe(`ssh-ed25519 AAAA by-hand\n${BOB} ${PUBLIC_KEY_MARKER}\n`);
    });

    it("never marks a key that was added by hand", async () => {
      await seed(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      await ak.reconcile("ubuntu", [CAROL], { keepExisting: true });
      expect(await read()).toBe(`${BOB}\n${ALICE} ${PUBLIC_KEY_MARKER}\n${CAROL} ${PUBLIC_KEY_MARKER}\n`);
    });

    it("on a missing file behaves as a plain reconcile", async () => {
      await ak.reconcile("ubuntu", [ALICE], { keepExisting: true });
      expect(await read()).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
    });

    it("is passed on by HostKeysReconciler to every user", async () => {
      await seed(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      const reconciler = new HostKeysReconciler(ak);
      await reconciler.reconcile(new Map([["ubuntu", []]]), { keepExisting: true });
      expect(await read()).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      await reconciler.reconcile(new Map([["ubuntu", []]]));
      expect(await read()).toBe("");
    });
  });

  describe("HostKeysReconciler", () => {
    it("keeps a key shared by two tasks while one of them remains (#4174)", async () => {
      await seed(`${ALICE}\n`); // the same key, added by hand: never ours to remove
      const reconciler = new HostKeysReconciler(ak);
      await reconciler.reconcile(new Map([["ubuntu", [ALICE, BOB, ALICE]]])); // tasks 1 and 2 share ALICE
      expect(await read()).toBe(`${ALICE}\n${ALICE} ${PUBLIC_KEY_MARKER}\n${BOB} ${PUBLIC_KEY_MARKER}\n`);
      await reconciler.reconcile(new Map([["ubuntu", [ALICE]]])); // task 1 (ALICE, BOB) ended
      expect(await read()).toBe(`${ALICE}\n${ALICE} ${PUBLIC_KEY_MARKER}\n`);
      await reconciler.reconcile(new Map([["ubuntu", []]])); // task 2 ended
      expect(await read()).toBe(`${ALICE}\n`);
    });

    it("runs one reconcile at a time, in call order", async () => {
      const events: string[] = [];
      let active = 0;
      class SlowKeys extends AuthorizedKeys {
        override async reconcile(user: string, keys: readonly string[]): Promise<void> {
          active += 1;
          expect(active).toBe(1);
          events.push(`start ${keys.length}`);
          await new Promise((resolve) => setTimeout(resolve, 5));
          await super.reconcile(user, keys);
          events.push(`end ${keys.length}`);
          active -= 1;
        }
      }
      const reconciler = new HostKeysReconciler(new SlowKeys(lookup));
      await Promise.all([
        reconciler.reconcile(new Map([["ubuntu", [ALICE]]])),
        reconciler.reconcile(new Map([["ubuntu", [ALICE, BOB]]])),
        reconciler.reconcile(new Map([["ubuntu", [BOB]]])),
      ]);
      expect(events).toEqual(["start 1", "end 1", "start 2", "end 2", "start 1", "end 1"]);
      expect(await read()).toBe(`${BOB} ${PUBLIC_KEY_MARKER}\n`);
    });

    it("reconciles every user and joins the failures into one AggregateError", async () => {
      const reconciler = new HostKeysReconciler(ak);
      const failure = reconciler.reconcile(
        new Map([
          ["ghost", [ALICE]],
          ["ubuntu", [BOB]],
        ]),
      );
      await expect(failure).rejects.toBeInstanceOf(AggregateError);
      const error = (await failure.catch((e: unknown) => e)) as AggregateError;
      expect(error.errors).toHaveLength(1);
      expect(error.message).toBe("failed to reconcile authorized_keys of ghost");
      expect(error.errors[0]).toBeInstanceOf(UserKeysReconcileError);
      expect((error.errors[0] as UserKeysReconcileError).user).toBe("ghost");
      expect((error.errors[0] as UserKeysReconcileError).cause).toBeInstanceOf(UnknownUserError);
      expect(await read()).toBe(`${BOB} ${PUBLIC_KEY_MARKER}\n`);
      await reconciler.reconcile(new Map([["ubuntu", []]]));
      expect(await read()).toBe("");
    });

    it("names every user that failed, in map order", async () => {
      const error = (await new HostKeysReconciler(ak)
        .reconcile(
          new Map([
            ["ghost", [ALICE]],
            ["ubuntu", [BOB]],
            ["phantom", []],
          ]),
        )
        .catch((e: unknown) => e)) as AggregateError;
      expect(error.message).toBe("failed to reconcile authorized_keys of ghost, phantom");
      expect(error.errors.map((e: UserKeysReconcileError) => e.message)).toEqual([
        "reconcile authorized_keys of ghost: unknown user: ghost",
        "reconcile authorized_keys of phantom: unknown user: phantom",
      ]);
    });
  });
});
