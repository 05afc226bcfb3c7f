import { describe, expect, it } from "vitest";
import type { GpuInfo, GpuInventory } from "./gpu-inventory.js";
import { GpuLock, InvalidGpuCountError, InvalidGpuInventoryError, NoGpuCapacityError } from "./gpu-lock.js";
import { thrown } from "../testing/thrown.js";

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

describe("GpuLock errors, word for word", () => {
  it("names each inventory defect", () => {
    const amd: GpuInfo = { ...gpu("/dev/dri/renderD128", 1), vendor: "amd" };
    const cases: [GpuInventory, string][] = [
      [
        { vendor: "none", gpus: [{ ...gpu("GPU-a", 0), vendor: "none" as never }] },
        "GPUs present but vendor is none",
      ],
      [{ vendor: "none", gpus: [gpu("GPU-a", 0)] }, "GPUs present but vendor is none"],
      [{ vendor: "nvidia", gpus: [gpu("GPU-a", 0), amd] }, "multiple GPU vendors detected"],
      [{ vendor: "nvidia", gpus: [gpu("GPU-a", 0), gpu("", 1)] }, "a GPU has an empty resource id"],
      [{ vendor: "nvidia", gpus: [gpu("GPU-a", 0), gpu("GPU-a", 1)] }, "duplicate GPU resource ids"],
    ];
    for (const [bad, message] of cases) {
      const error = thrown(() => new GpuLock(bad));
      expect(error).toBeInstanceOf(InvalidGpuInventoryError);
      expect(error.name).toBe("InvalidGpuInventoryError");
      expect(error.message).toBe(message);
    }
  });

  it("names a bad count and a lack of capacity", () => {
    const lock = new GpuLock(inventory);
    const bad = thrown(() => lock.acquire(0));
    expect([bad.name, bad.message]).toEqual([
      "InvalidGpuCountError",
      "count must be either positive or -1, got 0",
    ]);
    const full = thrown(() => lock.acquire(4));
    expect(full.name).toBe("NoGpuCapacityError");
    expect(full).toMatchObject({ requested: 4, available: 3 });
  });
});

describe("GpuLock order", () => {
  it("orders by index first and by id only between equal indices", () => {
    const lock = new GpuLock({
      vendor: "nvidia",
      gpus: [gpu("GPU-a", 2), gpu("GPU-z", 0), gpu("GPU-c", 1), gpu("GPU-b", 1)],
    });
    expect(lock.acquire(-1)).toEqual(["GPU-z", "GPU-b", "GPU-c", "GPU-a"]);
    expect(lock.lockedIds()).toEqual(["GPU-z", "GPU-b", "GPU-c", "GPU-a"]);
    const reversed = new GpuLock({ vendor: "nvidia", gpus: [gpu("GPU-b", 1), gpu("GPU-c", 1)] });
    expect(reversed.acquire(1)).toEqual(["GPU-b"]);
  });
});

describe("GpuLock with index ids (Intel Gaudi, Tenstorrent)", () => {
  const numbered = (vendor: "intel" | "tenstorrent", count: number): GpuInventory => ({
    vendor,
    gpus: Array.from({ length: count }, (_, index) => ({
      vendor,
      name: vendor === "intel" ? "HL-225" : "n300",
      vramMiB: 1,
      id: String(index),
      index,
      driverVersion: "",
    })).reverse(),
  });

  it("hands out by index, not by the ids' text order (10 after 9), and locks each device once", () => {
    for (const vendor of ["intel", "tenstorrent"] as const) {
      const lock = new GpuLock(numbered(vendor, 12));
      expect(lock.acquire(3), vendor).toEqual(["0", "1", "2"]);
      expect(lock.lock(["2", "9", "12"]), vendor).toEqual(["9"]);
      expect(lock.acquire(-1), vendor).toEqual(["3", "4", "5", "6", "7", "8", "10", "11"]);
      expect(lock.release(["10", "10", "0"]), vendor).toEqual(["10", "0"]);
      expect(lock.lockedIds(), vendor).toEqual(["1", "2", "3", "4", "5", "6", "7", "8", "9", "11"]);
    }
  });

  it("refuses an inventory that mixes a Gaudi card into a Tenstorrent host", () => {
    const tt = numbered("tenstorrent", 2);
    const mixed: GpuInventory = {
      vendor: "tenstorrent",
      gpus: [...tt.gpus, { ...gpu("7", 7), vendor: "intel" }],
    };
    expect(() => new GpuLock(mixed)).toThrow(InvalidGpuInventoryError);
  });
});
