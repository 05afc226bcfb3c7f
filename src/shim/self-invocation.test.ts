import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { nodeFlagsOfShebang, selfInvocation } from "./self-invocation.js";

describe("selfInvocation", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "taskshim-self-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("reads the Node flags of the bundle's shebang, and nothing of another interpreter's", () => {
    expect(
      nodeFlagsOfShebang("#!/usr/bin/env -S MALLOC_ARENA_MAX=1 node --max-semi-space-size=2 --expose-gc"),
    ).toEqual(["--max-semi-space-size=2", "--expose-gc"]);
    expect(nodeFlagsOfShebang("#!/usr/bin/env node")).toEqual([]);
    expect(nodeFlagsOfShebang("#!/opt/node/bin/node --expose-gc")).toEqual(["--expose-gc"]);
    expect(nodeFlagsOfShebang("#!/bin/sh")).toBeUndefined();
    expect(nodeFlagsOfShebang("\u007fELF")).toBeUndefined();
  });

  it("runs the bundle with this process's Node.js, never a node found on PATH", async () => {
    const bundle = join(dir, "taskshim.cjs");
    await writeFile(
      bundle,
      "#!/usr/bin/env -S MALLOC_ARENA_MAX=1 node --expose-gc\nconsole.log(process.execPath, typeof gc);\n",
    );
    await chmod(bundle, 0o755);
    const { file, args } = selfInvocation(bundle);
    expect(file).toBe(process.execPath);
    expect(args).toEqual(["--expose-gc", bundle]);

    // A PATH whose `node` is another program: spawning the script itself would run it.
    const decoy = join(dir, "bin");
    await mkdir(decoy);
    await writeFile(join(decoy, "node"), "#!/bin/sh\necho decoy node\n", { mode: 0o755 });
    const env = { ...process.env, PATH: `${decoy}:/usr/bin:/bin` };
    expect(spawnSync(bundle, [], { env, encoding: "utf8" }).stdout).toBe("decoy node\n");
    expect(spawnSync(file, [...args], { env, encoding: "utf8" }).stdout).toBe(
      `${process.execPath} function\n`,
    );
  });

  it("spawns a native binary, another interpreter's script or an unreadable path as it is", async () => {
    const native = join(dir, "taskshim");
    await writeFile(native, Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]));
    expect(selfInvocation(native)).toEqual({ file: native, args: [] });
    const shell = join(dir, "wrapper.sh");
    await writeFile(shell, "#!/bin/sh\nexec true\n");
    expect(selfInvocation(shell)).toEqual({ file: shell, args: [] });
    const missing = join(dir, "missing");
    expect(selfInvocation(missing)).toEqual({ file: missing, args: [] });
  });
});
