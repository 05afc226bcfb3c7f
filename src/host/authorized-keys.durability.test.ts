import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { PUBLIC_KEY_MARKER } from "../tasks/ssh-public-key.js";
import {
  dirSyncedAfter,
  durableReplaceViolations,
  fsJournal,
  resetFsJournal,
} from "../testing/fs-journal.js";
import { AuthorizedKeys, type UserLookup } from "./authorized-keys.js";

/*
 * Durability of authorized_keys pinned where it is decided: the system calls of its writes,
 * observed through a journaling node:fs/promises (as src/state/durability.test.ts does for
 * task.json and the task dirs). A kill -9 never tears a write, so only these tests can see a
 * missing fsync or rename.
 */
vi.mock("node:fs/promises", async (importOriginal) =>
  (await import("../testing/fs-journal.js")).journalingFs(await importOriginal()),
);

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "durability-keys-"));
  resetFsJournal();
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

/** Index of the last journal event matching. */
const lastIndex = (match: (e: (typeof fsJournal)[number]) => boolean): number =>
  fsJournal.findLastIndex(match);

describe("authorized_keys", () => {
  const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIM3w4GVANxwykR9noGY7PCFNXEBbweA+ReD2IuJzgeUW alice@laptop";
  const lookupIn =
    (home: string): UserLookup =>
    (name) =>
      Promise.resolve({ name, home, uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 });

  it("is replaced through a fsynced temp file and a rename, then ~/.ssh is fsynced", async () => {
    const ssh = join(root, ".ssh");
    await mkdir(ssh);
    await writeFile(join(ssh, "authorized_keys"), "ssh-ed25519 AAAA kept-by-hand\n");
    resetFsJournal();
    await new AuthorizedKeys(lookupIn(root)).reconcile("alice", [KEY]);
    expect(durableReplaceViolations(fsJournal, join(ssh, "authorized_keys"))).toEqual([]);
    expect(await readFile(join(ssh, "authorized_keys"), "utf8")).toBe(
      `ssh-ed25519 AAAA kept-by-hand\n${KEY} ${PUBLIC_KEY_MARKER}\n`,
    );
  });

  it("creates ~/.ssh durably (the home is fsynced after the mkdir) before the first file", async () => {
    await new AuthorizedKeys(lookupIn(root)).reconcile("alice", [KEY]);
    const ssh = join(root, ".ssh");
    const created = lastIndex((e) => e.op === "mkdir" && e.path === ssh);
    expect(created).toBeGreaterThan(-1);
    expect(dirSyncedAfter(fsJournal, created, root)).toBe(true);
    expect(durableReplaceViolations(fsJournal, join(ssh, "authorized_keys"))).toEqual([]);
  });
});
