import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  describeBytes,
  fileKindOf,
  FileTooLargeError,
  NotRegularFileError,
  readBoundedFile,
  readBoundedFileSync,
} from "./bounded-read.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "bounded-read-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The two readers, the synchronous one's throw as a rejection: one behaviour, checked for both. */
const READERS = [
  ["readBoundedFile", readBoundedFile],
  [
    "readBoundedFileSync",
    (path: string, max: number) => Promise.resolve().then(() => readBoundedFileSync(path, max)),
  ],
] as const;

describe.each(READERS)("%s", (_name, readBounded) => {
  const refusal = (path: string, max = 1024): Promise<unknown> =>
    readBounded(path, max).catch((error: unknown) => error);

  it("reads a regular file up to the cap, and an empty one", async () => {
    const path = join(dir, "f");
    await writeFile(path, "héllo");
    expect(await readBounded(path, 6)).toBe("héllo");
    await writeFile(path, "");
    expect(await readBounded(path, 6)).toBe("");
  });

  it("reads past the size fstat gave (a file that grew since) up to the cap, and refuses one beyond it", async () => {
    // A regular file whose fstat size (0) is less than what it holds, as a file appended to
    // between the fstat and the read.
    const path = "/proc/self/mountinfo";
    const text = await readBounded(path, 1024 * 1024);
    expect(text).toMatch(/ \/ /);
    const error = await refusal(path, 8);
    expect(error).toBeInstanceOf(FileTooLargeError);
    expect(error).toMatchObject({ limitBytes: 8, sizeBytes: undefined });
  });

  it("refuses a file beyond the cap without reading it, naming the limit and the size", async () => {
    const path = join(dir, "big");
    // Sparse: 63 MB that take no disk, as the file of unknown fields did.
    await writeFile(path, "");
    await truncate(path, 63 * 1024 * 1024);
    const error = await refusal(path, 1024 * 1024);
    expect(error).toBeInstanceOf(FileTooLargeError);
    expect((error as Error).message).toBe(`${path} is larger than 1 MiB (66060288 bytes)`);
    expect(error).toMatchObject({ limitBytes: 1024 * 1024, sizeBytes: 66060288 });
  });

  it("never waits on a FIFO: refused at once, unopened, with no writer on the other end", async () => {
    const path = join(dir, "fifo");
    execFileSync("mkfifo", [path]);
    const started = performance.now();
    const error = await refusal(path);
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(error).toBeInstanceOf(NotRegularFileError);
    expect((error as Error).message).toBe(`${path} is a FIFO, not a regular file`);
  });

  it("never follows a symlink: to /dev/zero (read without end before) or to a regular file", async () => {
    const zero = join(dir, "zero");
    await symlink("/dev/zero", zero);
    const target = join(dir, "target");
    await writeFile(target, "{}");
    const link = join(dir, "link");
    await symlink(target, link);
    for (const path of [zero, link]) {
      const error = await refusal(path);
      expect(error).toBeInstanceOf(NotRegularFileError);
      expect(error).toMatchObject({ path, kind: "a symbolic link" });
    }
  });

  it("refuses a device and a directory by their kind", async () => {
    expect(await refusal("/dev/null")).toMatchObject({ kind: "a character device" });
    const sub = join(dir, "sub");
    await mkdir(sub);
    expect(await refusal(sub)).toMatchObject({
      kind: "a directory",
      message: `${sub} is a directory, not a regular file`,
    });
  });

  it("passes a missing file's own error on, for the caller to tell apart", async () => {
    await expect(readBounded(join(dir, "absent"), 10)).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe("fileKindOf and describeBytes", () => {
  it("names each kind of file and sizes in the units a reader expects", () => {
    const stats = (kind: string) => ({
      isSymbolicLink: () => kind === "link",
      isFIFO: () => kind === "fifo",
      isCharacterDevice: () => kind === "char",
      isBlockDevice: () => kind === "block",
      isDirectory: () => kind === "dir",
      isSocket: () => kind === "socket",
    });
    expect(
      ["link", "fifo", "char", "block", "dir", "socket", "other"].map((k) => fileKindOf(stats(k))),
    ).toEqual([
      "a symbolic link",
      "a FIFO",
      "a character device",
      "a block device",
      "a directory",
      "a socket",
      "not a regular file",
    ]);
    expect(new NotRegularFileError("/x", "not a regular file").message).toBe("/x is not a regular file");
    expect([describeBytes(1024 * 1024), describeBytes(64 * 1024), describeBytes(1000)]).toEqual([
      "1 MiB",
      "64 KiB",
      "1000 bytes",
    ]);
  });
});
