import { lstat, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HOST_INFO_FILE, writeHostInfo } from "./host-info-file.js";

let home: string;
beforeEach(async () => {
  home = await mkdtemp(join(tmpdir(), "taskshim-hostinfo-"));
});
afterEach(async () => {
  await rm(home, { recursive: true, force: true });
});

describe("writeHostInfo", () => {
  it("creates host_info.json (0644) with the JSON of the info, and leaves no temp file", async () => {
    expect(await writeHostInfo(home, { cpus: 2 })).toBe("created");
    expect(JSON.parse(await readFile(join(home, HOST_INFO_FILE), "utf8"))).toEqual({ cpus: 2 });
    expect((await lstat(join(home, HOST_INFO_FILE))).mode & 0o777).toBe(0o644);
    expect(await readdir(home)).toEqual([HOST_INFO_FILE]);
  });

  it("leaves an existing file as it is (dstack-shim: only when absent)", async () => {
    await writeFile(join(home, HOST_INFO_FILE), "written by an earlier start");
    expect(await writeHostInfo(home, { cpus: 2 })).toBe("exists");
    expect(await readFile(join(home, HOST_INFO_FILE), "utf8")).toBe("written by an earlier start");
    expect(await readdir(home)).toEqual([HOST_INFO_FILE]);
  });

  it("neither follows nor replaces a symlink planted at its name, even a dangling one", async () => {
    const elsewhere = join(home, "elsewhere");
    await symlink(elsewhere, join(home, HOST_INFO_FILE));
    expect(await writeHostInfo(home, { cpus: 2 })).toBe("exists");
    expect(await readlink(join(home, HOST_INFO_FILE))).toBe(elsewhere);
    await expect(lstat(elsewhere)).rejects.toThrow(/ENOENT/);
  });

  it("removes the temp file a crash left behind before it writes", async () => {
    const stale = join(home, `.${HOST_INFO_FILE}.tmp-123-1`);
    await writeFile(stale, '{"cpus":');
    expect(await writeHostInfo(home, { cpus: 4 })).toBe("created");
    expect(await readdir(home)).toEqual([HOST_INFO_FILE]);
  });
});
