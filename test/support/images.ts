import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  access,
  chmod,
  constants,
  copyFile,
  mkdir,
  mkdtemp,
  open,
  rm,
  symlink,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import type Docker from "dockerode";

import { expectProgressOk, hasStatusCode, isPodman, TEST_LABEL, testDocker } from "./docker.js";

const execFileAsync = promisify(execFile);

/** Local tags of the images the integration tests run. Never pulled: built from Debian's static busybox. */
export interface TestImages {
  /** Static busybox with the usual applets on `/bin`, `CMD ["/bin/sh"]`. */
  readonly busybox: string;
  /** The busybox image plus a fake `/usr/sbin/sshd`, so `command -v sshd` succeeds (a "runner" image). */
  readonly runner: string;
}

const TEST_IMAGES: TestImages = { busybox: "taskshim-test/busybox:1", runner: "taskshim-test/runner:1" };

/** Repository of the throwaway images made by {@link createUniqueImage}. */
const UNIQUE_REPO = "taskshim-test/unique";

const BUSYBOX_CANDIDATES = ["/bin/busybox", "/usr/bin/busybox"];
const PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const COMMAND_TIMEOUT_MS = 30_000;
const IMPORT_TIMEOUT_MS = 60_000;
// Not `taskshim.test=1` itself: containers inherit image labels, and that one marks containers the tests own.

const FAKE_SSHD = "#!/bin/sh\n# taskshim test image: stands in for OpenSSH's sshd.\nexit 0\n";
const PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP = "root:x:0:\nnogroup:x:65534:\n";

/** One build per engine client (the global setup may serve two engines from one process). */
const building = new Map<Docker, Promise<TestImages>>();

/**
 * Make sure the test images exist locally, building the missing ones by `docker import` of a rootfs
 * holding Debian's static busybox. Fast when both tags exist; never pulls.
 */
export function ensureTestImages(docker: Docker = testDocker()): Promise<TestImages> {
  let build = building.get(docker);
  if (build === undefined) {
    build = buildMissing(docker).catch((err: unknown) => {
      building.delete(docker);
      throw err;
    });
    building.set(docker, build);
  }
  return build;
}

async function buildMissing(docker: Docker): Promise<TestImages> {
  // Sequential on purpose: both share the busybox lookup and the engine does the heavy lifting.
  if (!(await imageExists(TEST_IMAGES.busybox, docker))) await importRootfs(TEST_IMAGES.busybox, {}, docker);
  if (!(await imageExists(TEST_IMAGES.runner, docker))) {
    await importRootfs(TEST_IMAGES.runner, { "usr/sbin/sshd": FAKE_SSHD }, docker);
  }
  return TEST_IMAGES;
}

/**
 * Import a fresh copy of a test image whose single layer no other local image shares, tagged
 * `taskshim-test/unique:<random>`. Push it to a test registry and then remove it locally: only then
 * does a pull really download the layer (the engine skips layers it already has, "Already exists"),
 * which progress and mid-stream-failure tests need.
 */
export async function createUniqueImage(base: keyof TestImages = "busybox"): Promise<string> {
  const id = randomBytes(6).toString("hex");
  const tag = `${UNIQUE_REPO}:${id}`;
  const extra: Record<string, string> = { "etc/taskshim-unique": `${id}\n` };
  if (base === "runner") extra["usr/sbin/sshd"] = FAKE_SSHD;
  await importRootfs(tag, extra);
  return tag;
}

/**
 * Remove every image made by {@link createUniqueImage} (force; images already gone are fine), and
 * the test images left without a tag (two per run: 33.7 MB had piled up over the sessions). One a
 * container still uses (another run's, on a shared engine) is left for that run's own teardown.
 */
export async function removeUniqueImages(docker: Docker = testDocker()): Promise<void> {
  const images = await docker.listImages({ filters: { reference: [UNIQUE_REPO] } });
  for (const image of images) {
    try {
      await docker.getImage(image.Id).remove({ force: true });
    } catch (err) {
      if (!hasStatusCode(err, 404)) throw err;
    }
  }
  const untagged = await docker.listImages({
    filters: { dangling: ["true"], label: [`${TEST_LABEL}.image=1`] },
  });
  for (const image of untagged) {
    try {
      await docker.getImage(image.Id).remove();
    } catch (err) {
      if (!hasStatusCode(err, 404) && !hasStatusCode(err, 409)) throw err;
    }
  }
}

async function imageExists(ref: string, docker: Docker = testDocker()): Promise<boolean> {
  try {
    await docker.getImage(ref).inspect();
    return true;
  } catch (err) {
    if (hasStatusCode(err, 404)) return false;
    throw err;
  }
}

/** Build a busybox rootfs (plus `extraFiles`, path → content, mode 0755), tar it and import it as `tag`. */
async function importRootfs(
  tag: string,
  extraFiles: Readonly<Record<string, string>>,
  docker: Docker = testDocker(),
): Promise<void> {
  const work = await mkdtemp(join(tmpdir(), "taskshim-image-"));
  try {
    const rootfs = join(work, "rootfs");
    await writeRootfs(rootfs, extraFiles);
    const tarball = join(work, "rootfs.tar");
    await execFileAsync(
      "tar",
      ["--numeric-owner", "--owner=0", "--group=0", "-C", rootfs, "-cf", tarball, "."],
      {
        timeout: COMMAND_TIMEOUT_MS,
      },
    );
    const [repo, version] = splitTag(tag);
    // Podman 4.3's import ignores `tag` (the image is named repo:latest); the whole reference as
    // `repo` names it right there.
    const name = (await isPodman(docker)) ? { repo: tag } : { repo, tag: version };
    const stream = await docker.importImage(tarball, {
      ...name,
      changes: ['CMD ["/bin/sh"]', `ENV ${PATH_ENV}`, `LABEL ${TEST_LABEL}.image=1`],
      abortSignal: AbortSignal.timeout(IMPORT_TIMEOUT_MS),
    });
    await expectProgressOk(stream, `docker import ${tag}`);
    if (!(await imageExists(tag, docker)))
      throw new Error(`docker import ${tag} reported success but the tag is missing`);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

async function writeRootfs(rootfs: string, extraFiles: Readonly<Record<string, string>>): Promise<void> {
  const busybox = await findStaticBusybox();
  for (const dir of ["bin", "etc", "root", "tmp", "usr/bin", "usr/sbin", "var/tmp", "proc", "sys", "dev"]) {
    await mkdir(join(rootfs, dir), { recursive: true });
  }
  await chmod(join(rootfs, "tmp"), 0o1777);
  await chmod(join(rootfs, "var/tmp"), 0o1777);
  await chmod(join(rootfs, "root"), 0o700);
  await copyFile(busybox, join(rootfs, "bin/busybox"));
  await chmod(join(rootfs, "bin/busybox"), 0o755);

  const { stdout } = await execFileAsync(busybox, ["--list"], { timeout: COMMAND_TIMEOUT_MS });
  const applets = stdout.split("\n").filter((name) => /^[\w.[-]+$/.test(name) && name !== "busybox");
  if (!applets.includes("sh")) throw new Error(`${busybox} --list has no "sh" applet`);
  await Promise.all(applets.map((applet) => symlink("busybox", join(rootfs, "bin", applet))));

  await writeFile(join(rootfs, "etc/passwd"), PASSWD, { mode: 0o644 });
  await writeFile(join(rootfs, "etc/group"), GROUP, { mode: 0o644 });
  for (const [path, content] of Object.entries(extraFiles)) {
    const target = join(rootfs, path);
    await mkdir(join(target, ".."), { recursive: true });
    await writeFile(target, content, { mode: 0o755 });
    await chmod(target, 0o755);
  }
}

/** Debian's busybox-static; a dynamically linked busybox would not run in an otherwise empty rootfs. */
async function findStaticBusybox(): Promise<string> {
  for (const candidate of BUSYBOX_CANDIDATES) {
    try {
      await access(candidate, constants.X_OK);
    } catch {
      continue;
    }
    if (await isStaticElf(candidate)) return candidate;
    throw new Error(
      `${candidate} is dynamically linked; install busybox-static (npm run engine does, as root)`,
    );
  }
  throw new Error("busybox not found; install busybox-static (npm run engine does, as root)");
}

/** True when the ELF file has no PT_INTERP program header, i.e. needs no dynamic loader. */
async function isStaticElf(path: string): Promise<boolean> {
  const file = await open(path, "r");
  try {
    const head = Buffer.alloc(64);
    const { bytesRead } = await file.read(head, 0, 64, 0);
    if (bytesRead < 64 || head.readUInt32BE(0) !== 0x7f454c46) return false;
    const is64 = head[4] === 2;
    const le = head[5] === 1;
    const u16 = (b: Buffer, o: number): number => (le ? b.readUInt16LE(o) : b.readUInt16BE(o));
    const u32 = (b: Buffer, o: number): number => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
    const phoff = is64 ? Number(le ? head.readBigUInt64LE(32) : head.readBigUInt64BE(32)) : u32(head, 28);
    const phentsize = u16(head, is64 ? 54 : 42);
    const phnum = u16(head, is64 ? 56 : 44);
    const table = Buffer.alloc(phentsize * phnum);
    await file.read(table, 0, table.length, phoff);
    const PT_INTERP = 3;
    for (let i = 0; i < phnum; i++) {
      if (u32(table, i * phentsize) === PT_INTERP) return false;
    }
    return true;
  } finally {
    await file.close();
  }
}

function splitTag(ref: string): [repo: string, tag: string] {
  const colon = ref.lastIndexOf(":");
  if (colon <= ref.lastIndexOf("/")) return [ref, "latest"];
  return [ref.slice(0, colon), ref.slice(colon + 1)];
}
