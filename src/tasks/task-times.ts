/** A task's three times (epoch ms), each absent while unknown. */
export interface TaskTimes {
  readonly createdAt?: number;
  readonly startedAt?: number;
  readonly finishedAt?: number;
}

const IN_ORDER = ["createdAt", "startedAt", "finishedAt"] as const;

/**
 * The times in their one order, `createdAt ≤ startedAt ≤ finishedAt` wherever set. A time
 * found before an earlier event's (another clock's skew, a file an older version wrote) is
 * raised to that event's time: a container cannot start before its task was submitted, nor
 * finish before it started, so that bound is certain. No time is ever lowered, invented or
 * dropped, and `times` itself comes back when it is in order already.
 *
 * `TaskStore` applies it to every task it stores (`add` and `modify`), so memory, the API and
 * task.json never show an inversion, whichever path stamped the times.
 */
export function orderedTimes<T extends TaskTimes>(times: T): T {
  let floor = Number.NEGATIVE_INFINITY;
  let ordered = times;
  for (const key of IN_ORDER) {
    const time = times[key];
    if (time === undefined) continue;
    if (time < floor) ordered = { ...ordered, [key]: floor };
    // A NaN (no time at all) neither moves nor raises anything.
    else if (time > floor) floor = time;
  }
  return ordered;
}
