import { chmod, mkdir, readlink, stat } from "node:fs/promises";
import { posix } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { OperationBound } from "../exec/operation-bound.js";
import { CommandFailedError, runChecked, type CommandRunner } from "../exec/run-bounded.js";
import { errorMessage } from "../errors/error-message.js";
import type { VolumeInfo } from "../tasks/task-parts.js";

/** A host directory bind-mounted into the container (`TaskConfig.instance_mounts`). */
export interface InstanceMountPoint {
  readonly instance_path: string;
  readonly path: string;
}

/** A volume name that is not a plain path component. */
export class InvalidVolumeNameError extends Error {
  override readonly name = "InvalidVolumeNameError";
}

/** An instance mount whose host path is not absolute and normalised. */
export class InvalidInstancePathError extends Error {
  override readonly name = "InvalidInstancePathError";
}

/** Preparing one volume failed; `cause` says at which step. */
export class VolumePrepareError extends Error {
  override readonly name: string = "VolumePrepareError";
  constructor(
    readonly volume: string,
    options: ErrorOptions,
  ) {
    super(
      `format and mount volume ${volume}: ${options.cause === undefined ? "failed" : errorMessage(options.cause)}`,
      options,
    );
  }
}

/**
 * Preparing a volume was cut short because the shim is shutting down: one of its commands was
 * killed by the shutdown's interruption. Not a fault of the volume or the task: every step is
 * idempotent, so the next start prepares it again from where the disk is.
 */
export class VolumePrepareInterruptedError extends VolumePrepareError {
  override readonly name = "VolumePrepareInterruptedError";
}

/** Whether `error` (or a cause of it) is a command the shim's shutdown interrupted. */
export function isInterruptedCommand(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof CommandFailedError && e.outcome.kind === "interrupted") return true;
  }
  return false;
}

/** A volume's backend, device or file system is not usable. */
export class VolumeDeviceError extends Error {
  override readonly name = "VolumeDeviceError";
}

/** Some volumes could not be unmounted (or their state could not be read); the others were. */
export class VolumeUnmountError extends AggregateError {
  override readonly name = "VolumeUnmountError";
  constructor(
    readonly mountPoints: readonly string[],
    errors: readonly unknown[],
  ) {
    super(errors, `failed to unmount volume(s): [${mountPoints.join(" ")}]`);
  }
}

/** Where network volumes are mounted, as in dstack-shim. */
export const DEFAULT_VOLUME_MOUNT_ROOT = "/mnt/disks/dstack-volumes";

/** Waits and deadlines of volume preparation; tests shrink them. */
export interface VolumeTimings {
  /** Total wait for an AWS volume to appear in `lsblk` after attach. */
  readonly awsResolveMs: number;
  readonly awsPollMs: number;
  /** Total wait for the device to be a non-empty block device. */
  readonly deviceReadyMs: number;
  readonly deviceReadyPollMs: number;
  /** Re-probes of a blank-looking disk before it may be formatted, and the pause between them. */
  readonly blankConfirmations: number;
  readonly blankConfirmPauseMs: number;
  /** Deadline of short queries (`lsblk`, `blkid`, `mountpoint`). */
  readonly queryMs: number;
  readonly mkfsMs: number;
  readonly mountMs: number;
}

/** dstack-shim's waits, plus deadlines on every command. */
export const DEFAULT_VOLUME_TIMINGS: VolumeTimings = {
  awsResolveMs: 30_000,
  awsPollMs: 500,
  deviceReadyMs: 10_000,
  deviceReadyPollMs: 200,
  blankConfirmations: 3,
  blankConfirmPauseMs: 1_000,
  queryMs: 10_000,
  mkfsMs: 10 * 60_000,
  mountMs: 60_000,
};

/** Options of {@link HostVolumes}. */
export interface HostVolumesOptions {
  readonly mountRoot?: string;
  /** Where GCP's `google-<device name>` links live. */
  readonly diskByIdDir?: string;
  readonly timings?: Partial<VolumeTimings>;
}

const MAX_VOLUME_NAME = 128;
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * Network volumes and instance mount directories on the host. Every step is idempotent, so
 * a start resumed after a shim restart can run it again: a mounted volume is left as it is, and a
 * disk that has a file system is never formatted.
 */
export class HostVolumes {
  private readonly mountRoot: string;
  private readonly diskByIdDir: string;
  private readonly timings: VolumeTimings;

  constructor(
    private readonly commands: CommandRunner,
    options: HostVolumesOptions = {},
  ) {
    this.mountRoot = options.mountRoot ?? DEFAULT_VOLUME_MOUNT_ROOT;
    this.diskByIdDir = options.diskByIdDir ?? "/dev/disk/by-id";
    this.timings = { ...DEFAULT_VOLUME_TIMINGS, ...options.timings };
  }

  /**
   * The mount point of a volume: `<mount root>/<name>`.
   *
   * @throws InvalidVolumeNameError unless the name is a plain path component.
   */
  mountPointOf(name: string): string {
    if (
      name === "" ||
      name.length > MAX_VOLUME_NAME ||
      name.includes("/") ||
      name.includes("..") ||
      name === "." ||
      CONTROL.test(name)
    ) {
      throw new InvalidVolumeNameError(
        `invalid volume name ${JSON.stringify(name.slice(0, MAX_VOLUME_NAME))}`,
      );
    }
    return posix.join(this.mountRoot, name);
  }

  /**
   * Resolves, formats if allowed and needed, and mounts each volume in order; `onMounted(i)` runs
   * once volume `i` is mounted (also when it already was), so the caller can record progress. The
   * first failure stops the loop; volumes mounted before it stay mounted for the caller to release.
   *
   * @throws InvalidVolumeNameError, VolumePrepareInterruptedError when the shutdown interrupted a
   *   command (the task is not at fault), or VolumePrepareError naming the volume.
   */
  async prepareVolumes(
    volumes: readonly VolumeInfo[],
    onMounted?: (index: number) => Promise<void>,
  ): Promise<void> {
    for (const [index, volume] of volumes.entries()) {
      const mountPoint = this.mountPointOf(volume.name);
      try {
        if (!(await this.isMounted(mountPoint))) await this.formatAndMount(volume, mountPoint);
      } catch (error) {
        if (isInterruptedCommand(error))
          throw new VolumePrepareInterruptedError(volume.name, { cause: error });
        throw new VolumePrepareError(volume.name, { cause: error });
      }
      await onMounted?.(index);
    }
  }

  /**
   * Unmounts every volume that is mounted, trying all of them.
   *
   * @throws VolumeUnmountError listing the mount points that failed.
   */
  async unmountVolumes(volumes: readonly VolumeInfo[]): Promise<void> {
    const failed: string[] = [];
    const errors: unknown[] = [];
    for (const volume of volumes) {
      let mountPoint = volume.name;
      try {
        mountPoint = this.mountPointOf(volume.name);
        if (!(await this.isMounted(mountPoint))) continue;
        await runChecked(this.commands, {
          argv: ["umount", "-qf", mountPoint],
          bound: OperationBound.within(this.timings.mountMs),
        });
      } catch (error) {
        failed.push(mountPoint);
        errors.push(error);
      }
    }
    if (failed.length > 0) throw new VolumeUnmountError(failed, errors);
  }

  /**
   * Creates each missing instance directory (parents 0755) and makes it world-writable, so any
   * container user can write; an existing directory is left alone (on SSH fleets the admin owns
   * its permissions).
   *
   * @throws InvalidInstancePathError for a relative or unnormalised path.
   */
  async prepareInstanceMounts(mounts: readonly InstanceMountPoint[]): Promise<void> {
    for (const mount of mounts) {
      const path = mount.instance_path;
      if (!posix.isAbsolute(path) || CONTROL.test(path) || posix.normalize(path) !== path) {
        throw new InvalidInstancePathError(
          `instance path must be absolute and normalised: ${JSON.stringify(path.slice(0, 4096))}`,
        );
      }
      try {
        await stat(path);
        continue;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      }
      await mkdir(path, { recursive: true, mode: 0o755 });
      await chmod(path, 0o777);
    }
  }

  private async isMounted(mountPoint: string): Promise<boolean> {
    const argv = ["mountpoint", "-q", mountPoint];
    const outcome = await this.commands.run({ argv, bound: OperationBound.within(this.timings.queryMs) });
    // Any exit status but 0 means "not a mount point" (missing, not a directory, or a plain dir);
    // no answer at all means we do not know, and guessing could mount twice or skip an unmount.
    if (outcome.kind !== "exited" || outcome.code === null) throw new CommandFailedError(argv, outcome);
    return outcome.code === 0;
  }

  private async formatAndMount(volume: VolumeInfo, mountPoint: string): Promise<void> {
    const device = await this.resolveDevice(volume);
    const created = await this.initFileSystem(device, volume.init_fs);
    await mkdir(mountPoint, { recursive: true, mode: 0o755 });
    await runChecked(this.commands, {
      argv: ["mount", device, mountPoint],
      bound: OperationBound.within(this.timings.mountMs),
    });
    // Only a file system the shim made is opened to every container user; a user's own is theirs.
    if (created) await chmod(mountPoint, 0o777);
  }

  private async resolveDevice(volume: VolumeInfo): Promise<string> {
    switch (volume.backend) {
      case "aws":
        // Stryker disable next-line StringLiteral: any name that is not /dev/<name> yields no candidate device, "" included
        return this.resolveAwsDevice(volume.volume_id, volume.device_name ?? "");
      case "gcp":
        return this.resolveGcpDevice(volume.volume_id, volume.device_name ?? "");
      default:
        throw new VolumeDeviceError(`unsupported volume backend ${JSON.stringify(volume.backend)}`);
    }
  }

  /**
   * An EBS volume shows up some time after attach, as an NVMe disk whose serial is the volume id
   * without its dash, or (Xen) under the requested device name or its `xvd` twin. Then its first
   * partition, if it has any.
   */
  private async resolveAwsDevice(volumeId: string, deviceName: string): Promise<string> {
    const wait = OperationBound.within(this.timings.awsResolveMs);
    let base: string | undefined;
    for (;;) {
      const listing = await runChecked(this.commands, {
        argv: ["lsblk", "-dn", "-o", "NAME,SERIAL"],
        bound: OperationBound.within(this.timings.queryMs),
      });
      base = matchAwsSerial(listing, volumeId) ?? (await firstExisting(awsDeviceCandidates(deviceName)));
      if (base !== undefined) break;
      if (wait.expired()) {
        throw new VolumeDeviceError(
          `volume ${volumeId} not found among block devices after ${this.timings.awsResolveMs} ms`,
        );
      }
      await sleep(Math.min(this.timings.awsPollMs, wait.remainingMs() ?? 0));
    }
    const partitions = await runChecked(this.commands, {
      argv: ["lsblk", "-ln", "-o", "NAME", base],
      bound: OperationBound.within(this.timings.queryMs),
    });
    const [, firstPartition] = partitions.split("\n").map((line) => line.trim());
    return firstPartition ? `/dev/${firstPartition}` : base;
  }

  /** On GCP a disk is `/dev/disk/by-id/google-<device name the server chose>` (its `-part1` first). */
  private async resolveGcpDevice(volumeId: string, deviceName: string): Promise<string> {
    if (deviceName === "" || deviceName.includes("/") || CONTROL.test(deviceName)) {
      throw new VolumeDeviceError(
        `invalid GCP device name ${JSON.stringify(deviceName)} for volume ${volumeId}`,
      );
    }
    for (const link of [`google-${deviceName}-part1`, `google-${deviceName}`]) {
      try {
        const target = await readlink(posix.join(this.diskByIdDir, link));
        return posix.resolve(this.diskByIdDir, target);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      }
    }
    throw new VolumeDeviceError(`no /dev/disk/by-id link for volume ${volumeId} (device name ${deviceName})`);
  }

  /**
   * Returns true when it created the file system. mkfs is reached only for a ready, non-empty
   * block device that a direct superblock probe has found blank several times over: formatting a
   * disk that holds data is the one mistake here that cannot be undone.
   */
  private async initFileSystem(device: string, initFs: boolean): Promise<boolean> {
    await this.waitForBlockDevice(device);
    let fsType = await this.probeFileSystem(device);
    for (let attempt = 0; fsType === undefined && attempt < this.timings.blankConfirmations; attempt++) {
      await sleep(this.timings.blankConfirmPauseMs);
      fsType = await this.probeFileSystem(device);
    }
    if (fsType !== undefined) return false;
    if (!initFs) throw new VolumeDeviceError(`disk ${device} has no file system`);
    await runChecked(this.commands, {
      argv: ["mkfs.ext4", "-F", device],
      bound: OperationBound.within(this.timings.mkfsMs),
    });
    return true;
  }

  private async waitForBlockDevice(device: string): Promise<void> {
    const wait = OperationBound.within(this.timings.deviceReadyMs);
    const argv = ["lsblk", "-bdn", "-o", "SIZE", device];
    for (;;) {
      const outcome = await this.commands.run({ argv, bound: OperationBound.within(this.timings.queryMs) });
      let problem = "device has zero size";
      if (outcome.kind !== "exited" || outcome.code !== 0) {
        problem = new CommandFailedError(argv, outcome).message;
      } else if (Number(outcome.stdout.toString("utf8").trim()) > 0) {
        return;
      }
      if (wait.expired()) {
        throw new VolumeDeviceError(
          `device ${device} is not a ready non-empty block device after ${this.timings.deviceReadyMs} ms: ${problem}`,
        );
      }
      await sleep(Math.min(this.timings.deviceReadyPollMs, wait.remainingMs() ?? 0));
    }
  }

  /** The file system type, or undefined for a blank disk (blkid exit 2: no signature at all). */
  private async probeFileSystem(device: string): Promise<string | undefined> {
    const argv = ["blkid", "-p", "-o", "value", "-s", "TYPE", device];
    const outcome = await this.commands.run({ argv, bound: OperationBound.within(this.timings.queryMs) });
    if (outcome.kind === "exited") {
      const fsType = outcome.stdout.toString("utf8").trim();
      if (fsType !== "") return fsType;
      if (outcome.code === 2) return undefined;
      if (outcome.code === 0) {
        throw new VolumeDeviceError(
          `device ${device} has a non-filesystem signature but no file system; likely the wrong device`,
        );
      }
    }
    throw new CommandFailedError(argv, outcome);
  }
}

/** The `/dev/<name>` whose serial is the EBS volume id without its dash. */
export function matchAwsSerial(lsblkOutput: string, volumeId: string): string | undefined {
  if (!volumeId.startsWith("vol-")) return undefined;
  const serial = `vol${volumeId.slice("vol-".length)}`;
  for (const line of lsblkOutput.split("\n")) {
    const fields = line.trim().split(/\s+/);
    // Stryker disable next-line StringLiteral: fields.length === 2 is checked first, so fields[0] is defined
    if (fields.length === 2 && fields[1] === serial && /^[\w.-]+$/.test(fields[0] ?? "")) {
      return `/dev/${fields[0]}`;
    }
  }
  return undefined;
}

function awsDeviceCandidates(deviceName: string): string[] {
  // Stryker disable next-line ArrayDeclaration: a candidate that is no absolute path names nothing that stat finds (the shim's cwd holds no such file)
  if (!/^\/dev\/[\w.-]+$/.test(deviceName)) return [];
  // Stryker disable next-line Regex: the name matched ^/dev/ just above, so /dev/sd can only be at its start
  const xen = deviceName.replace(/^\/dev\/sd/, "/dev/xvd");
  return xen === deviceName ? [deviceName] : [deviceName, xen];
}

async function firstExisting(paths: readonly string[]): Promise<string | undefined> {
  for (const path of paths) {
    try {
      await stat(path);
      return path;
    } catch {
      // not there (yet)
    }
  }
  return undefined;
}
