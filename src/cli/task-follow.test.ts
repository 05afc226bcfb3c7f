import { describe, expect, it } from "vitest";
import {
  type ShimTaskEvent,
  ShimHttpError,
  ShimProtocolError,
  ShimUnreachableError,
  type ShimTaskInfo,
} from "../control/shim-client.js";
import type { TaskStatus } from "../tasks/task-status.js";
import {
  diffTaskStatuses,
  FollowTimeoutError,
  followStart,
  formatWatchEvent,
  UNREACHABLE_GRACE_MS,
  followEvents,
  waitTerminated,
  watchTasks,
  type LoopClock,
  type WatchEvent,
} from "./task-follow.js";

/** A clock whose sleep only moves time forward. */
function fakeClock(): LoopClock & { t: number } {
  const clock = {
    t: Date.parse("2025-01-01T00:00:00Z"),
    now: () => clock.t,
    wallNow: () => clock.t,
    sleep: (ms: number) => {
      clock.t += ms;
      return Promise.resolve();
    },
  };
  return clock;
}

const info = (status: TaskStatus, reason = ""): ShimTaskInfo => ({
  id: "t1",
  status,
  termination_reason: reason,
  termination_message: "",
});

/** A getTask that answers the scripted values (or throws the scripted errors) in order, then repeats the last. */
function scripted(answers: (ShimTaskInfo | Error)[]) {
  let i = 0;
  return {
    calls: () => i,
    getTask: (): Promise<ShimTaskInfo> => {
      const answer = answers[Math.min(i++, answers.length - 1)];
      return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer as ShimTaskInfo);
    },
  };
}

describe("followStart", () => {
  it("polls until the task runs, showing every poll", async () => {
    const client = scripted([info("pending"), info("pulling"), info("creating"), info("running")]);
    const seen: string[] = [];
    const final = await followStart(client, "t1", (t) => seen.push(t.status), {
      timeoutMs: 0,
      pollMs: 100,
      clock: fakeClock(),
    });
    expect(final.status).toBe("running");
    expect(seen).toEqual(["pending", "pulling", "creating", "running"]);
  });

  it("ends at terminated too", async () => {
    const client = scripted([info("pulling"), info("terminated", "creating_container_error")]);
    const final = await followStart(client, "t1", () => undefined, {
      timeoutMs: 0,
      pollMs: 1,
      clock: fakeClock(),
    });
    expect(final.termination_reason).toBe("creating_container_error");
  });

  it("rides out a shim restart (unreachable for a while)", async () => {
    const down = new ShimUnreachableError("connect ECONNREFUSED");
    const client = scripted([info("pulling"), down, down, down, info("running")]);
    const final = await followStart(client, "t1", () => undefined, {
      timeoutMs: 0,
      pollMs: 1_000,
      clock: fakeClock(),
    });
    expect(final.status).toBe("running");
  });

  it("gives up on a shim unreachable for longer than the grace period", async () => {
    const client = scripted([info("pulling"), new ShimUnreachableError("down")]);
    await expect(
      followStart(client, "t1", () => undefined, { timeoutMs: 0, pollMs: 1_000, clock: fakeClock() }),
    ).rejects.toThrow(ShimUnreachableError);
    expect(client.calls()).toBeGreaterThan(UNREACHABLE_GRACE_MS / 1_000);
  });

  it("fails at once on an HTTP error or a protocol error", async () => {
    for (const error of [
      new ShimHttpError(404, "Not Found\n", "/api/tasks/t1"),
      new ShimProtocolError("bad"),
    ]) {
      const client = scripted([error]);
      await expect(
        followStart(client, "t1", () => undefined, { timeoutMs: 0, pollMs: 1, clock: fakeClock() }),
      ).rejects.toBe(error);
    }
  });

  it("stops following at the timeout, saying the task goes on", async () => {
    const client = scripted([info("pulling")]);
    await expect(
      followStart(client, "t1", () => undefined, { timeoutMs: 5_000, pollMs: 250, clock: fakeClock() }),
    ).rejects.toThrow(
      new FollowTimeoutError(
        "task t1 is still pulling after 5 s; it keeps going (see taskshim tasks get t1)",
      ),
    );
  });
});

describe("waitTerminated", () => {
  it("waits through running and a shim restart until terminated", async () => {
    const down = new ShimUnreachableError("connect ECONNREFUSED");
    const client = scripted([info("running"), down, info("running"), info("terminated", "done_by_runner")]);
    const final = await waitTerminated(client, "t1", { timeoutMs: 0, pollMs: 100, clock: fakeClock() });
    expect(final.termination_reason).toBe("done_by_runner");
    expect(client.calls()).toBe(4);
  });

  it("gives up at its timeout, naming the status", async () => {
    const client = scripted([info("running")]);
    await expect(
      waitTerminated(client, "t1", { timeoutMs: 2_000, pollMs: 250, clock: fakeClock() }),
    ).rejects.toThrow("task t1 is still running after 2 s");
  });
});

describe("diffTaskStatuses", () => {
  it("reports additions, changes and removals", () => {
    const before = new Map<string, TaskStatus>([
      ["a", "pending"],
      ["b", "running"],
      ["c", "terminated"],
    ]);
    expect(
      diffTaskStatuses(before, [
        { id: "a", status: "preparing" },
        { id: "b", status: "running" },
        { id: "d", status: "pending" },
      ]),
    ).toEqual([
      { kind: "changed", id: "a", from: "pending", to: "preparing" },
      { kind: "added", id: "d", from: null, to: "pending" },
      { kind: "removed", id: "c", from: "terminated", to: null },
    ]);
    expect(
      diffTaskStatuses(
        before,
        [...before].map(([id, status]) => ({ id, status })),
      ),
    ).toEqual([]);
  });
});

describe("formatWatchEvent", () => {
  const time = "2025-01-01T00:00:00.000Z";
  it("prints one line per event", () => {
    expect(formatWatchEvent({ time, kind: "present", id: "a", from: null, to: "running" })).toBe(
      `${time}  a  running`,
    );
    expect(formatWatchEvent({ time, kind: "added", id: "a", from: null, to: "pending" })).toBe(
      `${time}  a  (new) -> pending`,
    );
    expect(
      formatWatchEvent({
        time,
        kind: "changed",
        id: "a",
        from: "running",
        to: "terminated",
        termination_reason: "done_by_runner",
      }),
    ).toBe(`${time}  a  running -> terminated  (done_by_runner)`);
    expect(formatWatchEvent({ time, kind: "removed", id: "a", from: "terminated", to: null })).toBe(
      `${time}  a  terminated -> (removed)`,
    );
  });
});

describe("watchTasks", () => {
  /** A shim whose task list changes by script at every poll. */
  function shim(
    lists: ({ id: string; status: TaskStatus }[] | Error)[],
    reasons: Record<string, string> = {},
  ) {
    let i = 0;
    return {
      listTasks: () => {
        const answer = lists[Math.min(i++, lists.length - 1)];
        return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer ?? []);
      },
      getTask: (id: string) =>
        reasons[id] === undefined
          ? Promise.reject(new ShimHttpError(404, "Not Found\n", `/api/tasks/${id}`))
          : Promise.resolve({ ...info("terminated", reasons[id]), id }),
    };
  }

  it("prints the present tasks, then each change with the reason of a termination", async () => {
    const events: WatchEvent[] = [];
    const client = shim(
      [
        [{ id: "a", status: "running" }],
        [
          { id: "a", status: "running" },
          { id: "b", status: "pending" },
        ],
        [
          { id: "a", status: "terminated" },
          { id: "b", status: "running" },
        ],
        [{ id: "b", status: "running" }],
      ],
      { a: "done_by_runner" },
    );
    await watchTasks(client, (e) => events.push(e), {
      intervalMs: 1_000,
      once: false,
      timeoutMs: 3_500,
      clock: fakeClock(),
    });
    expect(events.map(({ time: _time, ...rest }) => rest)).toEqual([
      { kind: "present", id: "a", from: null, to: "running" },
      { kind: "added", id: "b", from: null, to: "pending" },
      { kind: "changed", id: "a", from: "running", to: "terminated", termination_reason: "done_by_runner" },
      { kind: "changed", id: "b", from: "pending", to: "running" },
      { kind: "removed", id: "a", from: "terminated", to: null },
    ]);
    expect(events[0]?.time).toBe("2025-01-01T00:00:00.000Z");
    expect(events[1]?.time).toBe("2025-01-01T00:00:01.000Z");
  });

  it("with once, prints the present tasks and returns", async () => {
    const events: WatchEvent[] = [];
    const client = shim([[{ id: "a", status: "running" }], new Error("never asked")]);
    await watchTasks(client, (e) => events.push(e), {
      intervalMs: 1_000,
      once: true,
      timeoutMs: 0,
      clock: fakeClock(),
    });
    expect(events).toHaveLength(1);
  });

  it("fails when the first poll fails", async () => {
    const client = shim([new ShimUnreachableError("down")]);
    await expect(
      watchTasks(client, () => undefined, {
        intervalMs: 1_000,
        once: false,
        timeoutMs: 5_000,
        clock: fakeClock(),
      }),
    ).rejects.toThrow(ShimUnreachableError);
  });

  it("reports an outage once and carries on when the shim is back", async () => {
    const reachability: boolean[] = [];
    const events: WatchEvent[] = [];
    const down = new ShimUnreachableError("down");
    const client = shim([[], down, down, [{ id: "x", status: "running" }]]);
    await watchTasks(client, (e) => events.push(e), {
      intervalMs: 1_000,
      once: false,
      timeoutMs: 4_500,
      onReachability: (reachable) => reachability.push(reachable),
      clock: fakeClock(),
    });
    expect(reachability).toEqual([false, true]);
    expect(events.map((e) => e.kind)).toEqual(["added"]);
  });
});

describe("followEvents", () => {
  const ev = (
    kind: ShimTaskEvent["kind"],
    id: string,
    from: TaskStatus | null,
    to: TaskStatus | null,
  ): ShimTaskEvent => ({
    time: "2025-01-01T00:00:00.000Z",
    kind,
    id,
    from,
    to,
  });

  /** Each call of events() plays the next connection: its events, then an error or a clean end. */
  function connections(plays: readonly (readonly (ShimTaskEvent | Error)[])[]) {
    let n = 0;
    return {
      events: async function* (signal: AbortSignal): AsyncGenerator<ShimTaskEvent> {
        const play = plays[n++];
        if (!play) {
          // No more connections scripted: wait until the follower is stopped.
          await new Promise((resolve) => signal.addEventListener("abort", resolve));
          return;
        }
        for (const item of play) {
          if (item instanceof Error) throw item;
          yield await Promise.resolve(item);
        }
      },
    };
  }

  it("emits every event as it comes, and after a reconnect only what changed meanwhile", async () => {
    const down = new ShimUnreachableError("read ECONNRESET");
    const client = connections([
      [
        ev("present", "a", null, "running"),
        ev("present", "b", null, "running"),
        ev("added", "c", null, "pending"),
        ev("changed", "c", "pending", "preparing"),
        down,
      ],
      [down],
      // After the restart: a unchanged, b terminated meanwhile, c gone, d new.
      [
        ev("present", "a", null, "running"),
        ev("present", "b", null, "terminated"),
        ev("present", "d", null, "running"),
        ev("changed", "a", "running", "terminated"),
      ],
    ]);
    const seen: WatchEvent[] = [];
    const reach: boolean[] = [];
    await followEvents(client, (e) => seen.push(e), {
      timeoutMs: 200,
      retryMs: 1,
      clock: fakeClock(),
      onReachability: (r) => reach.push(r),
    });
    expect(seen.map((e) => `${e.kind} ${e.id} ${String(e.from)}>${String(e.to)}`)).toEqual([
      "present a null>running",
      "present b null>running",
      "added c null>pending",
      "changed c pending>preparing",
      "changed b running>terminated",
      "added d null>running",
      "removed c preparing>null",
      "changed a running>terminated",
    ]);
    expect(reach).toEqual([false, true]);
  });

  it("fails at once when the first connection fails (an older shim answers 404)", async () => {
    const client = connections([[new ShimHttpError(404, "404 page not found\n", "/api/events")]]);
    await expect(
      followEvents(client, () => undefined, { timeoutMs: 0, retryMs: 1, clock: fakeClock() }),
    ).rejects.toThrow(ShimHttpError);
  });
});
