/** Releases a lock; calling it twice is a no-op. */
export type Unlock = () => void;

/**
 * A FIFO mutex with a synchronous `tryLock`.
 *
 * Hand-written because async-mutex hands out its releaser asynchronously, while the reconciler
 * needs to know *now* whether a task is busy so it can skip it until the next tick.
 */
export class TaskLock {
  private held = false;
  private readonly waiters: (() => void)[] = [];

  /** Whether someone holds the lock. */
  get locked(): boolean {
    return this.held;
  }

  /** Takes the lock if it is free; otherwise returns undefined immediately. */
  tryLock(): Unlock | undefined {
    if (this.held) return undefined;
    this.held = true;
    return this.releaser();
  }

  /** Waits for the lock. */
  lock(): Promise<Unlock> {
    const unlock = this.tryLock();
    if (unlock) return Promise.resolve(unlock);
    return new Promise((resolve) => this.waiters.push(() => resolve(this.releaser())));
  }

  private releaser(): Unlock {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiters.shift();
      // Hand the lock straight to the next waiter, so a tryLock cannot slip in between.
      if (next) next();
      else this.held = false;
    };
  }
}
