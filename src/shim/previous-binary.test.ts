import { copyFile, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { fileIdentity } from "../components/file-identity.js";
import { PreviousBinary } from "./previous-binary.js";

let dir: string;
let binary: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "taskshim-previous-"));
  binary = join(dir, "taskshim");
  await writeFile(binary, "good\n", { mode: 0o755 });
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** What an install does: the new bytes renamed over the path. */
async function install(bytes: string): Promise<void> {
  await writeFile(join(dir, ".download"), bytes, { mode: 0o755 });
  await rename(join(dir, ".download"), binary);
}

describe("U16 the previous binary", () => {
  it("is kept as a hard link once it served, stays through an install, and goes back over a failed one", async () => {
    const previous = new PreviousBinary(binary);
    const first = await previous.standing();
    // Nothing kept yet: nothing to go back to.
    expect(first.kind).toBe("proven");
    expect(await previous.keep(first.identity)).toBe("kept");
    expect((await stat(previous.path)).ino).toBe((await stat(binary)).ino);
    expect(await previous.keep(first.identity)).toBe("already");

    await install("junk\n");
    expect((await previous.standing()).kind).toBe("trial");
    expect(await readFile(previous.path, "utf8")).toBe("good\n");
    expect(await previous.restore()).toBe(true);
    expect(await readFile(binary, "utf8")).toBe("good\n");
    expect((await stat(binary)).mode & 0o777).toBe(0o755);
    expect((await previous.standing()).kind).toBe("proven");
    // No temporary name is left beside them.
    expect((await readdir(dir)).sort()).toEqual(["taskshim", "taskshim.previous"]);
  });

  it("keeps the new binary once it served, so the next failure goes back to it", async () => {
    const previous = new PreviousBinary(binary);
    await previous.keep((await previous.standing()).identity);
    await install("second\n");
    const trial = await previous.standing();
    expect(trial.kind).toBe("trial");
    expect(await previous.keep(trial.identity)).toBe("kept");
    await install("junk\n");
    await previous.restore();
    expect(await readFile(binary, "utf8")).toBe("second\n");
  });

  it("a supervisor started again takes a kept copy with the same bytes for the binary in place, and another one for a trial", async () => {
    await copyFile(binary, `${binary}.previous`);
    expect((await new PreviousBinary(binary).standing()).kind).toBe("proven");
    await install("other\n");
    expect((await new PreviousBinary(binary).standing()).kind).toBe("trial");
  });

  it("a binary deleted from the path is on trial: the kept one goes back in its place", async () => {
    const previous = new PreviousBinary(binary);
    await previous.keep((await previous.standing()).identity);
    await rm(binary);
    expect((await previous.standing()).kind).toBe("trial");
    expect(await previous.restore()).toBe(true);
    expect(await readFile(binary, "utf8")).toBe("good\n");
  });

  it("does not keep a binary that was replaced while it ran (the identity it served from is gone)", async () => {
    const previous = new PreviousBinary(binary);
    const served = await fileIdentity(binary);
    await install("replaced meanwhile\n");
    expect(await previous.keep(served)).toBe("moved");
    expect(await previous.restore()).toBe(false);
  });
});
