import { chmod, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTestImages, type TestImages } from "./support/images.js";
import { ShimProcess, tempHome } from "./support/shim-process.js";

/** A stand-in dstack-runner: records its argv, one argument per line, in the mounted runner dir. */
const FAKE_RUNNER = `#!/bin/sh
for arg in "$@"; do printf '%s\\n' "$arg"; done > /tmp/runner/args.txt
test -z "$LD_PRELOAD" || exit 42
exit 0
`;

const KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice's laptop";

const RSA_KEY =
  "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCmDdTKile1wC/00RgFAfo6DVvldTrWec0U60RqdNbxQbtP7KqIt/XxrQPNRKj331xB74aFvSkDkwKPqkxBKNqybJ25sAAP98ODFAHuPwm+VMBZLThNW6sQCcLFvqTVIdUNP87i+RIa4nGjwRzdXytcShQbFLNPOpwGoweouqlNwQ== bob";

let shim: ShimProcess;
let images: TestImages;

beforeAll(async () => {
  images = await ensureTestImages();
  const bin = await tempHome("taskshim-runner-");
  const runner = join(bin, "dstack-runner");
  await writeFile(runner, FAKE_RUNNER);
  await chmod(runner, 0o755);
  shim = await ShimProcess.start({ args: ["--runner-binary-path", runner, "--runner-log-level", "5"] });
});

afterAll(async () => {
  await shim?.stop();
});

describe("dstack-runner launch", () => {
  it("starts the mounted runner with dstack-shim's arguments, keys quoted as single words", async () => {
    const id = `launch-${process.pid}-${Date.now().toString(36)}`;
    await shim.submit({
      id,
      name: "tst-launch",
      image_name: images.runner,
      container_ssh_keys: [KEY, RSA_KEY],
    });
    const done = await shim.waitTerminated(id);
    expect(done.termination_reason).toBe("done_by_runner");
    const args = (
      await readFile(join(shim.home, "runners", done.container_name, "runner", "args.txt"), "utf8")
    )
      .trimEnd()
      .split("\n");
    expect(args).toEqual([
      "--log-level",
      "5",
      "start",
      "--temp-dir",
      "/tmp/runner",
      "--http-port",
      "10999",
      "--ssh-port",
      "10022",
      "--http-address",
      "localhost",
      "--ssh-authorized-key",
      KEY,
      "--ssh-authorized-key",
      RSA_KEY,
    ]);
  });

  it("fails clearly when the image has no sshd and no package manager", async () => {
    const id = `nosshd-${process.pid}-${Date.now().toString(36)}`;
    await shim.submit({ id, name: "tst-nosshd", image_name: images.busybox });
    const done = await shim.waitTerminated(id);
    expect(done.termination_reason).toBe("container_exited_with_error");
    expect(done.termination_message).toContain("not supported");
  });
});
