import { describe, expect, it } from "vitest";
import type { GpuInfo, GpuInventory } from "./gpu-inventory.js";
import { GpuLock, InvalidGpuCountError, InvalidGpuInventoryError, NoGpuCapacityError } from "./gpu-lock.js";

const gpu = (id: string, index: number): GpuInfo => ({
  vendor: "nvidia",
  name: "H100",
  vramMiB: 81559,
  id,
  index,
  driverVersion: "570.86.15",
});
// Listed out of index order on purpose: the lock hands GPUs out by index.
const inventory: GpuInventory = {
  vendor: "nvidia",
  gpus: [gpu("GPU-c", 2), gpu("GPU-a", 0), gpu("GPU-b", 1)],
};

describe("GpuLock.acquire", () => {
  it("takes the lowest free indices first", () => {
    const lock = new GpuLock(inventory);
    expect(lock.acquire(2)).toEqual(["GPU-a", "GPU-b"]);
    expect(lock.acquire(1)).toEqual(["GPU-c"]);
    expect(lock.availableCount()).toBe(0);
  });

  it("fails without locking anything when there is not enough capacity", () => {
    const lock = new GpuLock(inventory);
    lock.acquire(2);
    expect(() => lock.acquire(2)).toThrow(new NoGpuCapacityError(2, 1));
    expect(() => lock.acquire(2)).toThrow("no capacity: 2 GPUs requested, 1 available");
    expect(lock.lockedIds()).toEqual(["GPU-a", "GPU-b"]);
  });

  it("takes every free GPU for -1 and never fails", () => {
    const lock = new GpuLock(inventory);
    lock.lock(["GPU-b"]);
    expect(lock.acquire(-1)).toEqual(["GPU-a", "GPU-c"]);
    expect(lock.acquire(-1)).toEqual([]);
    expect(new GpuLock({ vendor: "none", gpus: [] }).acquire(-1)).toEqual([]);
  });

  it.each([0, -2, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 60])("rejects the count %s", (count) => {
    const lock = new GpuLock(inventory);
    expect(() => lock.acquire(count)).toThrow(InvalidGpuCountError);
    expect(lock.availableCount()).toBe(3);
  });

  it("reports a huge but valid count as no capacity", () => {
    expect(() => new GpuLock(inventory).acquire(1_000_000)).toThrow(
      "no capacity: 1000000 GPUs requested, 3 available",
    );
  });
});

describe("GpuLock.lock and release", () => {
  it("locks only known, free ids and returns the newly locked ones", () => {
    const lock = new GpuLock(inventory);
    lock.acquire(1);
    expect(lock.lock(["GPU-a", "GPU-x", "GPU-c", "GPU-c"])).toEqual(["GPU-c"]);
    expect(lock.lockedIds()).toEqual(["GPU-a", "GPU-c"]);
  });

  it("releases only what is locked, so a second release is a no-op", () => {
    const lock = new GpuLock(inventory);
    const mine = lock.acquire(2);
    expect(lock.release([...mine, "GPU-c", "GPU-x"])).toEqual(["GPU-a", "GPU-b"]);
    expect(lock.release(mine)).toEqual([]);
    expect(lock.availableCount()).toBe(3);
  });

  it("cannot free another task's GPU when a restored task owns only what it newly locked", () => {
    const lock = new GpuLock(inventory);
    const other = lock.acquire(1);
    const restored = lock.lock(["GPU-a", "GPU-b"]);
    lock.release(restored);
    expect(lock.lockedIds()).toEqual(other);
  });
});

describe("GpuLock inventory checks", () => {
  it("rejects mixed vendors, GPUs under none, and duplicate ids", () => {
    const amd: GpuInfo = { ...gpu("/dev/dri/renderD128", 1), vendor: "amd" };
    expect(() => new GpuLock({ vendor: "nvidia", gpus: [gpu("GPU-a", 0), amd] })).toThrow(
      InvalidGpuInventoryError,
    );
    expect(() => new GpuLock({ vendor: "none", gpus: [gpu("GPU-a", 0)] })).toThrow(InvalidGpuInventoryError);
    expect(() => new GpuLock({ vendor: "nvidia", gpus: [gpu("GPU-a", 0), gpu("GPU-a", 1)] })).toThrow(
      InvalidGpuInventoryError,
    );
  });
});
