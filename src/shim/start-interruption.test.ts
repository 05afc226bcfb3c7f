import { describe, expect, it } from "vitest";
import { StartInterruptedError, unlessInterrupted } from "./start-interruption.js";

describe("unlessInterrupted", () => {
  it("is the work itself without a signal, and its outcome while the signal does not abort", async () => {
    await expect(unlessInterrupted(Promise.resolve(1), undefined)).resolves.toBe(1);
    const signal = new AbortController().signal;
    await expect(unlessInterrupted(Promise.resolve(2), signal)).resolves.toBe(2);
    await expect(unlessInterrupted(Promise.reject(new Error("boom")), signal)).rejects.toThrow("boom");
  });

  it("A17 stops waiting at once when the signal aborts, with its reason, leaving a step that never ends behind", async () => {
    const start = new AbortController();
    const hung = new Promise<never>(() => undefined);
    const waiting = unlessInterrupted(hung, start.signal);
    start.abort(new StartInterruptedError("SIGTERM"));
    const error = await waiting.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StartInterruptedError);
    expect(error).toMatchObject({ by: "SIGTERM", message: "start interrupted by SIGTERM" });
  });

  it("rejects at once when already aborted, and a late failure of the work left behind is not unhandled", async () => {
    const start = new AbortController();
    start.abort(new StartInterruptedError("SIGINT"));
    let fail!: (error: Error) => void;
    const work = new Promise<never>((_resolve, reject) => (fail = reject));
    await expect(unlessInterrupted(work, start.signal)).rejects.toThrow("start interrupted by SIGINT");
    fail(new Error("late"));
    await new Promise((resolve) => setImmediate(resolve));
  });
});
