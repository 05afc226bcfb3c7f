import type { GpuInfo, GpuInventory } from "./gpu-inventory.js";

/** `acquire` was asked for 0 GPUs, a count below -1, or a count that is not a safe integer. */
export class InvalidGpuCountError extends Error {
  override readonly name = "InvalidGpuCountError";
}

/** Fewer GPUs are free than were requested; nothing was locked. */
export class NoGpuCapacityError extends Error {
  override readonly name = "NoGpuCapacityError";
  constructor(
    readonly requested: number,
    readonly available: number,
  ) {
    super(`no capacity: ${requested} GPUs requested, ${available} available`);
  }
}

/** The inventory cannot back a lock: mixed vendors, GPUs under vendor `none`, or duplicate ids. */
export class InvalidGpuInventoryError extends Error {
  override readonly name = "InvalidGpuInventoryError";
}

/**
 * Which of the host's GPUs are taken. Memory only: after a restart it is rebuilt from the
 * containers, and a task owns exactly the ids `acquire` or `lock` returned to it, so releasing
 * them can never free a GPU that belongs to another task. Free GPUs are handed out by index, not
 * at random, so placement is reproducible.
 */
export class GpuLock {
  /** Resource ids ordered by GPU index. */
  private readonly ids: readonly string[];
  private readonly known: ReadonlySet<string>;
  private readonly locked = new Set<string>();

  constructor(inventory: GpuInventory) {
    if (inventory.vendor === "none" && inventory.gpus.length > 0) {
      throw new InvalidGpuInventoryError("GPUs present but vendor is none");
    }
    if (inventory.gpus.some((gpu) => gpu.vendor !== inventory.vendor)) {
      throw new InvalidGpuInventoryError("multiple GPU vendors detected");
    }
    const ids = [...inventory.gpus].sort(byIndexThenId).map((gpu) => gpu.id);
    if (ids.some((id) => id === "")) throw new InvalidGpuInventoryError("a GPU has an empty resource id");
    this.known = new Set(ids);
    if (this.known.size !== ids.length) throw new InvalidGpuInventoryError("duplicate GPU resource ids");
    this.ids = ids;
  }

  /**
   * Locks `count` free GPUs and returns their ids, lowest index first. `-1` takes every free GPU
   * and never fails, even with none free (the container then runs without GPUs).
   *
   * @throws InvalidGpuCountError for 0, anything below -1, or a non-integer.
   * @throws NoGpuCapacityError when fewer than `count` are free.
   */
  acquire(count: number): string[] {
    if (!Number.isSafeInteger(count) || count === 0 || count < -1) {
      throw new InvalidGpuCountError(`count must be either positive or -1, got ${count}`);
    }
    const free = this.ids.filter((id) => !this.locked.has(id));
    // Stryker disable next-line ConditionalExpression: for -1, free.length < -1 is false anyway
    if (count !== -1 && free.length < count) throw new NoGpuCapacityError(count, free.length);
    const taken = count === -1 ? free : free.slice(0, count);
    for (const id of taken) this.locked.add(id);
    return taken;
  }

  /**
   * Marks `ids` as locked and returns only the ones this call locked (unknown and already locked
   * ids are skipped), in the order given. Never fails.
   */
  lock(ids: readonly string[]): string[] {
    const newlyLocked: string[] = [];
    for (const id of ids) {
      if (!this.known.has(id) || this.locked.has(id)) continue;
      this.locked.add(id);
      newlyLocked.push(id);
    }
    return newlyLocked;
  }

  /** Frees `ids` and returns only the ones this call released, in the order given. Never fails. */
  release(ids: readonly string[]): string[] {
    const released: string[] = [];
    for (const id of ids) {
      if (this.locked.delete(id)) released.push(id);
    }
    return released;
  }

  /** The locked ids, lowest index first. */
  lockedIds(): string[] {
    return this.ids.filter((id) => this.locked.has(id));
  }

  /** How many GPUs are free. */
  availableCount(): number {
    return this.ids.length - this.locked.size;
  }
}

/** By index, then by id (in code-unit order) between equal indices. */
function byIndexThenId(a: GpuInfo, b: GpuInfo): number {
  // Ids are distinct (duplicates are refused after the sort), so an id tie never decides; and below 64
  // elements V8 sorts by binary insertion, which only asks whether an answer is below 0.
  // Stryker disable next-line EqualityOperator,ConditionalExpression: equivalent for the two reasons above
  return a.index - b.index || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}
