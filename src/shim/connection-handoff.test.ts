import type { ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import { describe, expect, it } from "vitest";
import { HANDOFF_ENV, HandoffRelay, shimHandoff } from "./connection-handoff.js";

/** A stand-in for a descriptor in transit: remembers whether this process closed its copy. */
class FakeHandle {
  closed = false;
  constructor(readonly name: string) {}
  close(): void {
    this.closed = true;
  }
  readStop(): number {
    return 0;
  }
}

/** A shim as the supervisor sees it: what it was sent; a send fails while `failing`. */
class FakeShim extends EventEmitter {
  readonly received: string[] = [];
  failing = false;
  send(
    _message: unknown,
    handle: FakeHandle,
    _options: unknown,
    done: (error: Error | null) => void,
  ): boolean {
    if (this.failing) {
      done(new Error("channel closed"));
      return false;
    }
    this.received.push(handle.name);
    done(null);
    return true;
  }
  /** The shim's message to its supervisor. */
  says(kind: "serving" | "connection", handle?: FakeHandle): void {
    this.emit("message", { taskshim: kind }, handle);
  }
}

const child = (shim: FakeShim): ChildProcess => shim as unknown as ChildProcess;

describe("HandoffRelay (the supervisor's side)", () => {
  it("keeps a draining shim's connections until the next one serves, then sends them on and closes its copies", () => {
    const relay = new HandoffRelay();
    const old = new FakeShim();
    relay.attach(child(old));
    old.says("serving");
    const a = new FakeHandle("a");
    const b = new FakeHandle("b");
    old.says("connection", a);
    old.says("connection", b);
    // Never back to the shim that gave them away.
    expect(old.received).toEqual([]);
    expect(relay.waiting).toBe(2);
    old.emit("exit");

    const next = new FakeShim();
    relay.attach(child(next));
    expect(next.received).toEqual([]);
    next.says("serving");
    expect(next.received).toEqual(["a", "b"]);
    expect([a.closed, b.closed]).toEqual([true, true]);
    expect(relay.waiting).toBe(0);
  });

  it("keeps a connection whose send failed for the next shim that serves", () => {
    const relay = new HandoffRelay();
    const dying = new FakeShim();
    relay.attach(child(dying));
    dying.failing = true;
    dying.says("serving");
    const other = new FakeShim();
    relay.attach(child(other));
    const a = new FakeHandle("a");
    other.says("connection", a);
    expect(a.closed).toBe(false);
    expect(relay.waiting).toBe(1);
    const next = new FakeShim();
    relay.attach(child(next));
    next.says("serving");
    expect(next.received).toEqual(["a"]);
  });

  it("once closed (the supervisor stops), closes what waits and what still arrives", () => {
    const relay = new HandoffRelay();
    const shim = new FakeShim();
    relay.attach(child(shim));
    const a = new FakeHandle("a");
    shim.says("connection", a);
    relay.close();
    expect(a.closed).toBe(true);
    const late = new FakeHandle("late");
    shim.says("connection", late);
    expect(late.closed).toBe(true);
    expect(relay.waiting).toBe(0);
  });
});

describe("shimHandoff (the shim's side)", () => {
  it("is offered only by a supervisor: the marker and an IPC channel", () => {
    const send = (): boolean => true;
    const proc = (env: NodeJS.ProcessEnv, withChannel: boolean): NodeJS.Process =>
      ({ env, ...(withChannel ? { send } : {}) }) as unknown as NodeJS.Process;
    expect(shimHandoff(proc({ [HANDOFF_ENV]: "1" }, true))).toBeDefined();
    expect(shimHandoff(proc({}, true))).toBeUndefined();
    expect(shimHandoff(proc({ [HANDOFF_ENV]: "1" }, false))).toBeUndefined();
  });
});
