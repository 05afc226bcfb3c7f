import { rejected } from "../testing/thrown.js";
import { chmod, mkdir, mkdtemp, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EXPIRED, exited, INTERRUPTED, ScriptedCommands } from "../testing/fake-command-runner.js";
import { CommandFailedError, type BoundedOutcome, type CommandRunner } from "../exec/run-bounded.js";
import {
  HostVolumes,
  InvalidInstancePathError,
  InvalidVolumeNameError,
  VolumeDeviceError,
  VolumePrepareError,
  VolumePrepareInterruptedError,
  VolumeUnmountError,
  matchAwsSerial,
  type VolumeTimings,
} from "./volumes.js";
import type { VolumeInfo } from "../tasks/task-parts.js";

type Script = (argv: readonly string[]) => BoundedOutcome;

const FAST: Partial<VolumeTimings> = {
  awsResolveMs: 1_000,
  awsPollMs: 1,
  deviceReadyMs: 1_000,
  deviceReadyPollMs: 1,
  blankConfirmPauseMs: 1,
};

/** A host whose disks behave as told; every command answers from these maps. */
function host(options: {
  mounted?: ReadonlySet<string>;
  blkid?: () => BoundedOutcome;
  size?: string;
  serials?: () => string;
  partitions?: string;
  failUmount?: ReadonlySet<string>;
}): Script {
  return (argv) => {
    const [cmd = "", ...args] = argv;
    const last = args.at(-1) ?? "";
    switch (cmd) {
      case "mountpoint":
        return exited(options.mounted?.has(last) ? 0 : 32);
      case "lsblk":
        if (args.includes("NAME,SERIAL")) return exited(0, options.serials?.() ?? "");
        if (args.includes("SIZE")) return exited(0, `${options.size ?? "10737418240"}\n`);
        return exited(0, options.partitions ?? `${last.replace("/dev/", "")}\n`);
      case "blkid":
        return options.blkid?.() ?? exited(2);
      case "umount":
        return options.failUmount?.has(last) ? exited(32, "", "target is busy") : exited(0);
      default:
        return exited(0);
    }
  };
}

describe("HostVolumes", () => {
  let root: string;
  let byId: string;
  let mountRoot: string;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), "volumes-"));
    byId = join(root, "by-id");
    mountRoot = join(root, "mnt");
    await mkdir(byId);
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const volumes = (commands: CommandRunner) =>
    new HostVolumes(commands, { mountRoot, diskByIdDir: byId, timings: FAST });
  const gcp = (overrides: Partial<VolumeInfo> = {}): VolumeInfo => ({
    backend: "gcp",
    name: "data",
    volume_id: "vol-id",
    init_fs: true,
    device_name: "pd-data",
    ...overrides,
  });
  const expectAllBounded = (commands: ScriptedCommands) => {
    expect(commands.calls.length).toBeGreaterThan(0);
    for (const call of commands.calls) expect(call.bound?.remainingMs()).toBeGreaterThan(0);
  };

  describe("mountPointOf", () => {
    it("puts a volume under the mount root", () => {
      expect(new HostVolumes(new ScriptedCommands(host({}))).mountPointOf("data-1")).toBe(
        "/mnt/disks/dstack-volumes/data-1",
      );
    });

    it.each(["", ".", "..", "a/b", "/abs", "a..b", "x\u0000y", "new\nline", "v".repeat(129)])(
      "rejects %j",
      (name) => {
        expect(() => volumes(new ScriptedCommands(host({}))).mountPointOf(name)).toThrow(
          InvalidVolumeNameError,
        );
      },
    );
  });

  describe("prepareVolumes", () => {
    it("formats a blank GCP disk only after re-probing it, mounts it and opens its root", async () => {
      await symlink("../../sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({}));
      const mounted: number[] = [];
      await volumes(commands).prepareVolumes([gcp()], (index) => {
        mounted.push(index);
        return Promise.resolve();
      });
      const device = join(root, "..", "sdb");
      const mp = join(mountRoot, "data");
      expect(commands.argvs()).toEqual([
        `mountpoint -q ${mp}`,
        `lsblk -bdn -o SIZE ${device}`,
        ...Array<string>(4).fill(`blkid -p -o value -s TYPE ${device}`),
        `mkfs.ext4 -F ${device}`,
        `mount ${device} ${mp}`,
      ]);
      expect(mounted).toEqual([0]);
      expect((await stat(mp)).mode & 0o777).toBe(0o777);
      expectAllBounded(commands);
    });

    it("prefers the GCP first-partition link and never formats a disk with a file system", async () => {
      await symlink("/dev/sdc", join(byId, "google-pd-data"));
      await symlink("/dev/sdc1", join(byId, "google-pd-data-part1"));
      const commands = new ScriptedCommands(host({ blkid: () => exited(0, "xfs\n") }));
      await volumes(commands).prepareVolumes([gcp()]);
      expect(commands.argvs()).toContain(`mount /dev/sdc1 ${join(mountRoot, "data")}`);
      expect(commands.argvs().some((argv) => argv.startsWith("mkfs"))).toBe(false);
      expect((await stat(join(mountRoot, "data"))).mode & 0o777).toBe(0o755);
    });

    it("believes a file system that appears on a re-probe", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      let probes = 0;
      const commands = new ScriptedCommands(
        host({ blkid: () => (++probes < 3 ? exited(2) : exited(0, "ext4\n")) }),
      );
      await volumes(commands).prepareVolumes([gcp()]);
      expect(probes).toBe(3);
      expect(commands.argvs().some((argv) => argv.startsWith("mkfs"))).toBe(false);
    });

    it("fails on a blank disk when it may not format it", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({}));
      const error = await volumes(commands)
        .prepareVolumes([gcp({ init_fs: false })])
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(VolumePrepareError);
      expect((error as VolumePrepareError).volume).toBe("data");
      expect((error as Error).cause).toEqual(new VolumeDeviceError("disk /dev/sdb has no file system"));
      expect(commands.argvs().some((argv) => /^(mkfs|mount )/.test(argv))).toBe(false);
    });

    it("refuses a disk with a signature that is not a file system, or a failed probe", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const partitioned = new ScriptedCommands(host({ blkid: () => exited(0, "") }));
      await expect(volumes(partitioned).prepareVolumes([gcp()])).rejects.toThrow(/non-filesystem signature/);
      const broken = new ScriptedCommands(host({ blkid: () => exited(4, "", "I/O error") }));
      await expect(volumes(broken).prepareVolumes([gcp()])).rejects.toThrow(/I\/O error/);
      for (const commands of [partitioned, broken]) {
        expect(commands.argvs().some((argv) => argv.startsWith("mkfs"))).toBe(false);
      }
    });

    it.each([
      ["timed out", () => EXPIRED],
      ["interrupted", () => INTERRUPTED],
      [
        "killed by a signal",
        (): BoundedOutcome => ({
          kind: "exited",
          code: null,
          signal: "SIGKILL",
          stdout: Buffer.alloc(0),
          stderr: Buffer.alloc(0),
        }),
      ],
    ])(
      "never formats when blkid %s, first or on a re-probe of a blank-looking disk",
      async (label, outcome) => {
        await symlink("/dev/sdb", join(byId, "google-pd-data"));
        // First probe: the failure itself. Then: blank twice, and the failure on the last re-probe.
        for (const failOn of [1, 3]) {
          let probes = 0;
          const commands = new ScriptedCommands(
            host({ blkid: () => (++probes === failOn ? outcome() : exited(2)) }),
          );
          const error = await volumes(commands)
            .prepareVolumes([gcp({ init_fs: true })])
            .catch((e: unknown) => e);
          expect(error).toBeInstanceOf(VolumePrepareError);
          // Only the shutdown's interruption is told apart: the task resumes instead of failing.
          expect(error instanceof VolumePrepareInterruptedError).toBe(label === "interrupted");
          expect((error as Error).cause).toBeInstanceOf(CommandFailedError);
          expect(probes).toBe(failOn);
          expect(commands.argvs().some((argv) => /^(mkfs|mount )/.test(argv))).toBe(false);
        }
      },
    );

    it("waits a bounded time for a non-empty block device", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({ size: "0" }));
      await expect(volumes(commands).prepareVolumes([gcp()])).rejects.toThrow(
        /not a ready non-empty block device/,
      );
      expect(commands.argvs().some((argv) => argv.startsWith("blkid"))).toBe(false);
    });

    it("fails when GCP has no link for the disk, or the device name is not plain", async () => {
      const commands = new ScriptedCommands(host({}));
      await expect(volumes(commands).prepareVolumes([gcp()])).rejects.toThrow(/no \/dev\/disk\/by-id link/);
      await expect(volumes(commands).prepareVolumes([gcp({ device_name: "/dev/sdv" })])).rejects.toThrow(
        /invalid GCP device name/,
      );
    });

    it("skips a volume that is already mounted, and still reports it", async () => {
      const mp = join(mountRoot, "data");
      const commands = new ScriptedCommands(host({ mounted: new Set([mp]) }));
      const mounted: number[] = [];
      await volumes(commands).prepareVolumes([gcp()], (index) => {
        mounted.push(index);
        return Promise.resolve();
      });
      expect(commands.argvs()).toEqual([`mountpoint -q ${mp}`]);
      expect(mounted).toEqual([0]);
    });

    it("does not guess when mountpoint gives no answer", async () => {
      const commands = new ScriptedCommands(() => EXPIRED);
      const error = await volumes(commands)
        .prepareVolumes([gcp()])
        .catch((e: unknown) => e);
      expect((error as Error).cause).toBeInstanceOf(CommandFailedError);
      expect(commands.calls).toHaveLength(1);
    });

    it("finds an AWS volume by its NVMe serial once it appears, and uses its first partition", async () => {
      let listings = 0;
      const commands = new ScriptedCommands(
        host({
          serials: () =>
            ++listings < 3 ? "nvme0n1 vol0aaaa\n" : "nvme0n1 vol0aaaa\nnvme1n1 vol0123456789abcdef0\n",
          partitions: "nvme1n1\nnvme1n1p1\nnvme1n1p2\n",
          blkid: () => exited(0, "ext4\n"),
        }),
      );
      await volumes(commands).prepareVolumes([
        {
          backend: "aws",
          name: "ebs",
          volume_id: "vol-0123456789abcdef0",
          init_fs: false,
          device_name: "/dev/sdf",
        },
      ]);
      expect(listings).toBe(3);
      expect(commands.argvs()).toContain("lsblk -ln -o NAME /dev/nvme1n1");
      expect(commands.argvs()).toContain(`mount /dev/nvme1n1p1 ${join(mountRoot, "ebs")}`);
      expectAllBounded(commands);
    });

    it("gives up on an AWS volume that never appears", async () => {
      const commands = new ScriptedCommands(host({ serials: () => "nvme0n1 vol0aaaa\n" }));
      const started = Date.now();
      await expect(
        volumes(commands).prepareVolumes([
          { backend: "aws", name: "ebs", volume_id: "vol-0123", init_fs: true, device_name: null },
        ]),
      ).rejects.toThrow(/volume vol-0123 not found among block devices/);
      expect(Date.now() - started).toBeLessThan(2_000);
    });

    it("rejects unknown backends and bad names before running anything", async () => {
      const commands = new ScriptedCommands(host({}));
      await expect(volumes(commands).prepareVolumes([gcp({ backend: "azure" })])).rejects.toThrow(
        /unsupported volume backend/,
      );
      const before = commands.calls.length;
      await expect(volumes(commands).prepareVolumes([gcp({ name: "../etc" })])).rejects.toBeInstanceOf(
        InvalidVolumeNameError,
      );
      expect(commands.calls.length).toBe(before);
    });

    it("stops at the first failure, leaving earlier volumes mounted", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({ blkid: () => exited(0, "ext4\n") }));
      const mounted: number[] = [];
      await expect(
        volumes(commands).prepareVolumes(
          [gcp(), gcp({ name: "other", device_name: "pd-missing" })],
          (index) => {
            mounted.push(index);
            return Promise.resolve();
          },
        ),
      ).rejects.toThrow(/volume other/);
      expect(mounted).toEqual([0]);
    });
  });

  describe("unmountVolumes", () => {
    it("unmounts only mounted volumes and reports every failure at once", async () => {
      const [a, b, c] = ["a", "b", "c"].map((name) => join(mountRoot, name));
      const commands = new ScriptedCommands(
        host({ mounted: new Set([a ?? "", c ?? ""]), failUmount: new Set([a ?? ""]) }),
      );
      const error = await volumes(commands)
        .unmountVolumes(["a", "b", "c"].map((name) => gcp({ name })))
        .catch((e: unknown) => e);
      expect(commands.argvs()).toEqual([
        `mountpoint -q ${a}`,
        `umount -qf ${a}`,
        `mountpoint -q ${b}`,
        `mountpoint -q ${c}`,
        `umount -qf ${c}`,
      ]);
      expect(error).toBeInstanceOf(VolumeUnmountError);
      expect((error as VolumeUnmountError).mountPoints).toEqual([a]);
      expect((error as Error).message).toBe(`failed to unmount volume(s): [${a}]`);
      expectAllBounded(commands);
    });

    it("is a no-op when nothing is mounted, and treats an unanswered check as a failure", async () => {
      await expect(volumes(new ScriptedCommands(host({}))).unmountVolumes([gcp()])).resolves.toBeUndefined();
      const commands = new ScriptedCommands(() => EXPIRED);
      await expect(volumes(commands).unmountVolumes([gcp(), gcp({ name: "x/y" })])).rejects.toMatchObject({
        mountPoints: [join(mountRoot, "data"), "x/y"],
      });
    });
  });

  describe("prepareInstanceMounts", () => {
    it("creates missing directories world-writable and leaves existing ones alone", async () => {
      const existing = join(root, "existing");
      await mkdir(existing);
      await chmod(existing, 0o700);
      const created = join(root, "new", "deep", "dir");
      await volumes(new ScriptedCommands(host({}))).prepareInstanceMounts([
        { instance_path: existing, path: "/a" },
        { instance_path: created, path: "/b" },
      ]);
      expect((await stat(existing)).mode & 0o777).toBe(0o700);
      expect((await stat(created)).mode & 0o777).toBe(0o777);
      expect((await stat(join(root, "new"))).mode & 0o777).toBe(0o755 & ~process.umask());
    });

    it.each(["relative/path", "/a/../b", "/a/./b", "/a//b", "", "/a\u0000b"])("rejects %j", async (path) => {
      await expect(
        volumes(new ScriptedCommands(host({}))).prepareInstanceMounts([{ instance_path: path, path: "/x" }]),
      ).rejects.toBeInstanceOf(InvalidInstancePathError);
    });
  });

  describe("the I/O branches, word for word", () => {
    const aws = (device_name: string | null, timings: Partial<VolumeTimings> = {}) => ({
      run: (commands: CommandRunner) =>
        new HostVolumes(commands, {
          mountRoot,
          diskByIdDir: byId,
          timings: { ...FAST, ...timings },
        }).prepareVolumes([
          { backend: "aws", name: "ebs", volume_id: "vol-0123", init_fs: false, device_name },
        ]),
    });
    const formatted = () => exited(0, "ext4\n");

    it("keeps each umount failure as the cause of the aggregate, in order", async () => {
      const [a, b] = ["a", "b"].map((name) => join(mountRoot, name));
      const commands = new ScriptedCommands(
        host({ mounted: new Set([a ?? "", b ?? ""]), failUmount: new Set([a ?? "", b ?? ""]) }),
      );
      const error = (await rejected(
        volumes(commands).unmountVolumes([gcp({ name: "a" }), gcp({ name: "b" })]),
      )) as VolumeUnmountError;
      expect(error.errors.map((e: Error) => e.message)).toEqual([
        `umount -qf ${a}: exit status 32: target is busy`,
        `umount -qf ${b}: exit status 32: target is busy`,
      ]);
    });

    it("reports an instance path it cannot examine, and creates nothing", async () => {
      const file = join(root, "a-file");
      await writeFile(file, "");
      const error = await rejected(
        volumes(new ScriptedCommands(host({}))).prepareInstanceMounts([
          { instance_path: `${file}/sub`, path: "/x" },
        ]),
      );
      // The stat's own error (not a mkdir's): nothing is created under something that is not a directory.
      expect(error).toMatchObject({ code: "ENOTDIR", syscall: "stat" });
    });

    it("does not read a mountpoint killed by a signal as 'not mounted'", async () => {
      const killed: BoundedOutcome = {
        kind: "exited",
        code: null,
        signal: "SIGKILL",
        stdout: Buffer.alloc(0),
        stderr: Buffer.alloc(0),
      };
      const commands = new ScriptedCommands(() => killed);
      const error = await rejected(volumes(commands).prepareVolumes([gcp()]));
      expect(error.message).toBe(
        `format and mount volume data: mountpoint -q ${join(mountRoot, "data")}: killed by SIGKILL`,
      );
      expect(commands.calls).toHaveLength(1);
    });

    it("names a GCP volume without a device name, or with a control character in it", async () => {
      const commands = new ScriptedCommands(host({}));
      expect((await rejected(volumes(commands).prepareVolumes([gcp({ device_name: null })]))).message).toBe(
        'format and mount volume data: invalid GCP device name "" for volume vol-id',
      );
      expect(
        (await rejected(volumes(commands).prepareVolumes([gcp({ device_name: "pd\ndata" })]))).message,
      ).toBe('format and mount volume data: invalid GCP device name "pd\\ndata" for volume vol-id');
      expect(commands.argvs()).toEqual([
        `mountpoint -q ${join(mountRoot, "data")}`,
        `mountpoint -q ${join(mountRoot, "data")}`,
      ]);
    });

    it("stops at a GCP partition link it cannot read instead of taking the whole disk", async () => {
      await writeFile(join(byId, "google-pd-data-part1"), "");
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({ blkid: formatted }));
      const error = await rejected(volumes(commands).prepareVolumes([gcp()]));
      expect(error.cause).toMatchObject({ code: "EINVAL" });
      expect(commands.argvs().some((argv) => argv.startsWith("mount "))).toBe(false);
    });

    it("lists AWS disks by serial, then the found disk's partitions, trimming each line", async () => {
      const commands = new ScriptedCommands(
        host({ serials: () => "nvme1n1 vol0123\n", partitions: "nvme1n1 \n nvme1n1p1 \n", blkid: formatted }),
      );
      await aws(null).run(commands);
      expect(commands.argvs().slice(0, 4)).toEqual([
        `mountpoint -q ${join(mountRoot, "ebs")}`,
        "lsblk -dn -o NAME,SERIAL",
        "lsblk -ln -o NAME /dev/nvme1n1",
        "lsblk -bdn -o SIZE /dev/nvme1n1p1",
      ]);
    });

    it("falls back to an existing /dev device name when no serial matches, and only a plain one", async () => {
      const commands = new ScriptedCommands(host({ blkid: formatted }));
      await aws("/dev/null").run(commands);
      expect(commands.argvs()).toContain(`mount /dev/null ${join(mountRoot, "ebs")}`);
      // Existing paths, but not a plain /dev/<name>: never used.
      const elsewhere = join(root, "dev", "disk");
      await mkdir(join(root, "dev"));
      await writeFile(elsewhere, "");
      for (const name of [elsewhere, "/dev/fd/1", "/dev/"]) {
        const refused = new ScriptedCommands(host({ blkid: formatted }));
        const error = await rejected(aws(name, { awsResolveMs: 30 }).run(refused));
        expect(error.message, name).toBe(
          "format and mount volume ebs: volume vol-0123 not found among block devices after 30 ms",
        );
        expect(
          refused.argvs().some((argv) => argv.startsWith("mount ")),
          name,
        ).toBe(false);
      }
    });

    it.skipIf(process.getuid?.() !== 0)("tries the Xen twin (xvd) of an sd device name", async () => {
      const suffix = `taskshim-test-${process.pid}-${Date.now()}`;
      const twin = `/dev/xvd${suffix}`;
      await writeFile(twin, "");
      try {
        const commands = new ScriptedCommands(host({ blkid: formatted }));
        await aws(`/dev/sd${suffix}`).run(commands);
        expect(commands.argvs()).toContain(`mount ${twin} ${join(mountRoot, "ebs")}`);
      } finally {
        await rm(twin, { force: true });
      }
    });

    it("names why a device is not ready: its lsblk failure, or its zero size", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const failing = new ScriptedCommands((argv) =>
        argv.includes("SIZE") ? exited(32, "", "not a block device") : host({})(argv),
      );
      const hv = new HostVolumes(failing, {
        mountRoot,
        diskByIdDir: byId,
        timings: { ...FAST, deviceReadyMs: 20 },
      });
      expect((await rejected(hv.prepareVolumes([gcp()]))).message).toBe(
        "format and mount volume data: device /dev/sdb is not a ready non-empty block device after 20 ms: " +
          "lsblk -bdn -o SIZE /dev/sdb: exit status 32: not a block device",
      );
      const empty = new HostVolumes(new ScriptedCommands(host({ size: "0" })), {
        mountRoot,
        diskByIdDir: byId,
        timings: { ...FAST, deviceReadyMs: 20 },
      });
      expect((await rejected(empty.prepareVolumes([gcp()]))).message).toBe(
        "format and mount volume data: device /dev/sdb is not a ready non-empty block device after 20 ms: device has zero size",
      );
    });

    it("polls a device that is not ready yet at the poll interval, within its deadline", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      let sizes = 0;
      const commands = new ScriptedCommands((argv) =>
        argv.includes("SIZE") ? exited(0, ++sizes < 3 ? "0\n" : "1024\n") : host({ blkid: formatted })(argv),
      );
      const started = Date.now();
      await new HostVolumes(commands, {
        mountRoot,
        diskByIdDir: byId,
        timings: { ...FAST, deviceReadyMs: 20_000, deviceReadyPollMs: 1 },
      }).prepareVolumes([gcp()]);
      expect(sizes).toBe(3);
      // Waiting the whole deadline between polls would take 40 s.
      expect(Date.now() - started).toBeLessThan(10_000);
    });

    it("reads a blank blkid answer with only a newline as blank", async () => {
      await symlink("/dev/sdb", join(byId, "google-pd-data"));
      const commands = new ScriptedCommands(host({ blkid: () => exited(2, "\n") }));
      await volumes(commands).prepareVolumes([gcp()]);
      expect(commands.argvs()).toContain("mkfs.ext4 -F /dev/sdb");
    });
  });
});

describe("matchAwsSerial", () => {
  it("matches the volume id without its dash", () => {
    const listing = "nvme0n1 vol0aaaa\nnvme1n1 vol0123\nxvda\n";
    expect(matchAwsSerial(listing, "vol-0123")).toBe("/dev/nvme1n1");
    expect(matchAwsSerial(listing, "vol-9999")).toBeUndefined();
    expect(matchAwsSerial(listing, "0123")).toBeUndefined();
  });
});

describe("matchAwsSerial on real lsblk layouts", () => {
  it("accepts aligned columns and surrounding blanks, and only a plain device name", () => {
    expect(matchAwsSerial("nvme0n1     vol0aaaa\nnvme1n1     vol0123\n", "vol-0123")).toBe("/dev/nvme1n1");
    expect(matchAwsSerial("  nvme1n1 vol0123  \n", "vol-0123")).toBe("/dev/nvme1n1");
    expect(matchAwsSerial("nvme!1 vol0123\n", "vol-0123")).toBeUndefined();
    expect(matchAwsSerial("nvme1! vol0123\n", "vol-0123")).toBeUndefined();
    expect(matchAwsSerial("nvme1n1 vol0123 extra\n", "vol-0123")).toBeUndefined();
  });

  it("wants an EBS id that starts with vol-", () => {
    expect(matchAwsSerial("nvme1n1 vol-0123\nnvme2n1 vol0123\n", "xvol-0123")).toBeUndefined();
  });
});

describe("volume errors, word for word", () => {
  it("names each error class and says what failed", () => {
    expect(new InvalidVolumeNameError("x").name).toBe("InvalidVolumeNameError");
    expect(new InvalidInstancePathError("x").name).toBe("InvalidInstancePathError");
    expect(new VolumeDeviceError("x").name).toBe("VolumeDeviceError");
    const prepare = new VolumePrepareError("data", { cause: new Error("mkfs exploded") });
    expect([prepare.name, prepare.message]).toEqual([
      "VolumePrepareError",
      "format and mount volume data: mkfs exploded",
    ]);
    expect(new VolumePrepareError("data", {}).message).toBe("format and mount volume data: failed");
    const unmount = new VolumeUnmountError(["/mnt/a", "/mnt/b"], [new Error("busy")]);
    expect([unmount.name, unmount.message]).toEqual([
      "VolumeUnmountError",
      "failed to unmount volume(s): [/mnt/a /mnt/b]",
    ]);
  });

  it("accepts a 128-character volume name and names a longer one by its first 128", () => {
    const hv = new HostVolumes(new ScriptedCommands(host({})), { mountRoot: "/m" });
    expect(hv.mountPointOf("v".repeat(128))).toBe(`/m/${"v".repeat(128)}`);
    expect(() => hv.mountPointOf("v".repeat(200))).toThrow(
      new InvalidVolumeNameError(`invalid volume name "${"v".repeat(128)}"`),
    );
  });

  it("names a bad instance path by its first 4096 characters", async () => {
    const long = `relative/${"p".repeat(5000)}`;
    await expect(
      new HostVolumes(new ScriptedCommands(host({}))).prepareInstanceMounts([
        { instance_path: long, path: "/x" },
      ]),
    ).rejects.toThrow(
      `instance path must be absolute and normalised: ${JSON.stringify(long.slice(0, 4096))}`,
    );
  });
});
