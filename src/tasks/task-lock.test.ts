import { describe, expect, it } from "vitest";
import { TaskLock, type Unlock } from "./task-lock.js";

/** Lets every queued promise callback run. */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe("TaskLock", () => {
  it("tryLock takes a free lock, returns undefined while held, and succeeds after release", () => {
    const lock = new TaskLock();
    const unlock = lock.tryLock();
    expect(unlock).toBeTypeOf("function");
    expect(lock.locked).toBe(true);
    expect(lock.tryLock()).toBeUndefined();
    unlock?.();
    expect(lock.locked).toBe(false);
    const again = lock.tryLock();
    expect(again).toBeTypeOf("function");
    again?.();
  });

  it("lock blocks until the holder releases", async () => {
    const lock = new TaskLock();
    const first = await lock.lock();
    let acquired = false;
    const second = lock.lock().then((unlock) => {
      acquired = true;
      return unlock;
    });
    await settle();
    expect(acquired).toBe(false);
    first();
    const unlock = await second;
    expect(acquired).toBe(true);
    expect(lock.locked).toBe(true);
    unlock();
    expect(lock.locked).toBe(false);
  });

  it("hands the lock to waiters in FIFO order", async () => {
    const lock = new TaskLock();
    const holder = await lock.lock();
    const order: number[] = [];
    const waiters = [1, 2, 3, 4].map((n) =>
      lock.lock().then(async (unlock) => {
        order.push(n);
        await settle();
        unlock();
      }),
    );
    holder();
    await Promise.all(waiters);
    expect(order).toEqual([1, 2, 3, 4]);
    expect(lock.locked).toBe(false);
  });

  it("gives a released lock to a waiter before a later tryLock", async () => {
    const lock = new TaskLock();
    const holder = lock.tryLock();
    let waiterUnlock: Unlock | undefined;
    const waiter = lock.lock().then((unlock) => (waiterUnlock = unlock));
    holder?.();
    // The waiter's promise callback has not run yet, but it already owns the lock.
    expect(lock.tryLock()).toBeUndefined();
    expect(lock.locked).toBe(true);
    await waiter;
    expect(lock.tryLock()).toBeUndefined();
    waiterUnlock?.();
    expect(lock.tryLock()).toBeTypeOf("function");
  });

  it("ignores a second call of the same unlock", async () => {
    const lock = new TaskLock();
    const first = await lock.lock();
    let secondUnlock: Unlock | undefined;
    let thirdAcquired = false;
    const second = lock.lock().then((unlock) => (secondUnlock = unlock));
    const third = lock.lock().then((unlock) => {
      thirdAcquired = true;
      return unlock;
    });
    first();
    first();
    await second;
    await settle();
    // A double release must not pass the lock on to the third waiter while the second holds it.
    expect(thirdAcquired).toBe(false);
    expect(lock.tryLock()).toBeUndefined();
    secondUnlock?.();
    (await third)();
    expect(lock.locked).toBe(false);
    first();
    expect(lock.locked).toBe(false);
    const unlock = lock.tryLock();
    first();
    expect(lock.locked).toBe(true);
    unlock?.();
  });
});
