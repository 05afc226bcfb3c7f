import { execFile, execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { copyFile, mkdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { hasStatusCode, testDocker, testEngine } from "./docker.js";
import { SHIM_BUNDLE, tempHome } from "./shim-process.js";

/*
 * The host the chaos suite stands in for: two AMD-style GPUs (harmless 1:3 character devices,
 * as in gpu.test.ts), GCP-style network disks (loop devices behind `google-<name>` links) and
 * ed25519-shaped host keys (each scenario keeps its own boot id). Everything lives under one temp dir that
 * `teardown()` removes, together with the loop devices, mounts and `cx-` containers.
 */

const execFileAsync = promisify(execFile);

/** Prefix of every container, task id and task name the chaos suite creates. */
export const CHAOS_PREFIX = "cx-";
/** The shim's label on task containers, and its task id label. */
export const LABEL_IS_TASK = "ai.dstack.shim.is-task";
export const LABEL_TASK_ID = "ai.dstack.shim.task-id";
/** Appended to every authorized_keys entry the shim writes. */
export const KEY_MARKER = "# added by dstack-shim";

/** The render nodes of the fixture, as the shim names them (its GPU resource ids). */
export const FIXTURE_GPUS = ["/dev/dri/renderD128", "/dev/dri/renderD129"] as const;

/** A GCP-style volume backed by a loop device. */
export interface LoopVolume {
  readonly index: number;
  readonly device: string;
  readonly backingFile: string;
  /** The GCP device name: the shim resolves `<by-id>/google-<deviceName>`. */
  readonly deviceName: string;
}

/** One task-config volume entry for a pool volume (`init_fs: true`). */
export function volumeConfig(volume: LoopVolume): Record<string, unknown> {
  return {
    backend: "gcp",
    name: `cx-vol${volume.index}`,
    volume_id: `vol-cx${volume.index}`,
    init_fs: true,
    device_name: volume.deviceName,
  };
}

/** The container name dstack-shim derives for a task (`<name>-<8 hex of sha256(name/id)>`). */
export function containerNameFor(name: string, id: string): string {
  return `${name}-${createHash("sha256").update(`${name}/${id}`).digest("hex").slice(0, 8)}`;
}

/** An ed25519-shaped public key line (`ssh-ed25519 <base64> <comment>`) the shim accepts. */
export function makeHostKey(comment: string): string {
  const field = (data: Buffer): Buffer => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(data.length);
    return Buffer.concat([length, data]);
  };
  const blob = Buffer.concat([field(Buffer.from("ssh-ed25519")), field(randomBytes(32))]);
  return `ssh-ed25519 ${blob.toString("base64")} ${comment}`;
}

/** The base64 field of a key line (what identifies the key). */
export function keyBlob(line: string): string {
  return line.trim().split(/\s+/)[1] ?? "";
}

/** Mount points under `root` as /proc/mounts lists them (a stacked mount appears twice). */
export async function mountsUnder(root: string): Promise<string[]> {
  const text = await readFile("/proc/mounts", "utf8");
  const decode = (s: string): string =>
    s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
  return text
    .split("\n")
    .map((line) => decode(line.split(" ")[1] ?? ""))
    .filter((point) => point === root || point.startsWith(`${root}/`));
}

/** The suite-wide host fixture. */
export class ChaosHost {
  /** Distinguishes this run's containers from any other run's (`cx-<nonce>-…`). */
  readonly nonce = randomBytes(2).toString("hex");
  root = "";
  gpuFixture = "";
  byIdDir = "";
  /** A copy of the bundle under test, so a rebuild during the run cannot mix two versions. */
  bundle = "";
  readonly volumes: LoopVolume[] = [];

  /** Creates the fixture with `volumeCount` pre-formatted loop volumes. */
  async setup(volumeCount: number): Promise<void> {
    // Leftovers of an aborted earlier run only: a chaos run going on right now keeps its own.
    await removeChaosContainers(CHAOS_PREFIX, STALE_AFTER_S);
    await detachStaleLoops();
    this.root = await tempHome("taskshim-chaos-");
    this.bundle = join(this.root, "taskshim.cjs");
    await copyFile(process.env.CHAOS_SHIM_BUNDLE || SHIM_BUNDLE, this.bundle);
    const nodes = this.fixtureNodes();
    this.gpuFixture = join(this.root, "gpus.json");
    await writeFile(
      this.gpuFixture,
      JSON.stringify({
        vendor: "amd",
        driver_version: "6.8.5",
        kfd_path: nodes.kfd,
        gpus: [
          { name: "MI300X", vram_mib: 196608, render_node: nodes.renderD128 },
          { name: "MI300X", vram_mib: 196608, render_node: nodes.renderD129 },
        ],
      }),
    );
    this.byIdDir = join(this.root, "by-id");
    await mkdir(this.byIdDir);
    for (let index = 0; index < volumeCount; index++) {
      const backingFile = join(this.root, `disk${index}.img`);
      await execFileAsync("truncate", ["-s", "16M", backingFile]);
      const { stdout } = await execFileAsync("losetup", ["-f", "--show", backingFile]);
      const device = stdout.trim();
      const volume: LoopVolume = { index, device, backingFile, deviceName: `cxd${this.nonce}${index}` };
      this.volumes.push(volume);
      // Pre-formatted: a blank disk costs the shim three 1 s re-probes before mkfs, and the
      // chaos rows are about mounts and releases, not about formatting.
      await execFileAsync("mkfs.ext4", ["-q", "-F", device]);
      await symlink(device, join(this.byIdDir, `google-${volume.deviceName}`));
    }
  }

  /** The volume of pool slot `index`. */
  /**
   * The GPU fixture's device nodes: harmless character devices (the null device's number) made
   * under the root. Podman reports a container's device by the /dev path of its number, not by
   * the path it was given (a node made with `mknod … c 1 3` reads back as /dev/null), so the
   * shim could not tell which fixture GPU a container holds after a restart; on Podman the
   * fixture names distinct harmless /dev nodes instead (on a real host the render nodes are
   * those /dev paths already).
   */
  private fixtureNodes(): { kfd: string; renderD128: string; renderD129: string } {
    if (testEngine() === "podman")
      return { kfd: "/dev/null", renderD128: "/dev/zero", renderD129: "/dev/full" };
    const nodes = { kfd: "kfd", renderD128: "renderD128", renderD129: "renderD129" };
    for (const node of Object.values(nodes)) execFileSync("mknod", [join(this.root, node), "c", "1", "3"]);
    return {
      kfd: join(this.root, nodes.kfd),
      renderD128: join(this.root, nodes.renderD128),
      renderD129: join(this.root, nodes.renderD129),
    };
  }

  volume(index: number): LoopVolume {
    const volume = this.volumes[index];
    if (!volume) throw new Error(`no chaos volume ${index}`);
    return volume;
  }

  /** Removes containers, mounts, loop devices and the temp dir this run created. */
  async teardown(): Promise<void> {
    await removeChaosContainers(`${CHAOS_PREFIX}${this.nonce}-`);
    if (this.root === "") return;
    for (const point of (await mountsUnder(this.root)).reverse()) {
      await execFileAsync("umount", ["-l", point]).catch(() => undefined);
    }
    for (const volume of this.volumes) {
      await execFileAsync("losetup", ["-d", volume.device]).catch(() => undefined);
    }
    await rm(this.root, { recursive: true, force: true });
  }
}

/** Containers of an earlier chaos run older than this are leftovers of an aborted run. */
const STALE_AFTER_S = 3600;

/**
 * Force-removes the containers named `<prefix>…` that carry the shim's task label or ours
 * (only those created more than `olderThanS` seconds ago, when given).
 */
export async function removeChaosContainers(prefix: string, olderThanS = 0): Promise<void> {
  const docker = testDocker();
  const [tasks, strays] = await Promise.all([
    docker.listContainers({ all: true, filters: { label: [`${LABEL_IS_TASK}`] } }),
    docker.listContainers({ all: true, filters: { label: ["taskshim.chaos=1"] } }),
  ]);
  const cutoff = Date.now() / 1000 - olderThanS;
  const ids = new Set(
    [...tasks, ...strays]
      .filter((c) => (c.Names ?? []).some((n) => n.replace(/^\//, "").startsWith(prefix)))
      .filter((c) => olderThanS === 0 || c.Created < cutoff)
      .map((c) => c.Id),
  );
  await Promise.all(
    [...ids].map(async (id) => {
      try {
        await docker.getContainer(id).remove({ force: true, v: true });
      } catch (error) {
        if (!hasStatusCode(error, 404) && !hasStatusCode(error, 409)) throw error;
      }
    }),
  );
}

/** Detaches loop devices of an earlier, aborted chaos run (their backing file is gone). */
async function detachStaleLoops(): Promise<void> {
  const { stdout } = await execFileAsync("losetup", ["-a"]).catch(() => ({ stdout: "" }));
  for (const line of stdout.split("\n")) {
    const match = /^(\/dev\/loop\d+):.*\((\/\S*taskshim-chaos-[^)\s]*)( \(deleted\))?\)/.exec(line);
    if (!match?.[1] || !match[2]) continue;
    if (match[3] === undefined && existsSync(match[2])) continue; // a live run's disk
    await execFileAsync("losetup", ["-d", match[1]]).catch(() => undefined);
  }
}
