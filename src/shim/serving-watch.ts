import type { ChildProcess } from "node:child_process";
import { request } from "node:http";
import { setTimeout as sleep } from "node:timers/promises";

/** Where a shim serves: the address and port `serve`'s flags name (src/shim/held-socket.ts). */
export interface ServeAddress {
  readonly host: string;
  readonly port: number;
}

/** How often a shim that does not say it serves is asked its healthcheck, and for how long each time. */
const POLL_MS = 250;
const ASK_TIMEOUT_MS = 2_000;

/**
 * Resolves once `child` serves: it says so on its IPC channel (`{"taskshim":"serving"}`, sent
 * once it accepts), or, for a release that does not (before the connection handoff), its
 * healthcheck answers 200 at `address`. Never rejects; `signal` ends the watch (it then never
 * resolves).
 */
export function whenServing(
  child: ChildProcess,
  address: ServeAddress | undefined,
  signal: AbortSignal,
): Promise<void> {
  return new Promise<void>((resolve) => {
    let done = false;
    const finish = (): void => {
      if (done) return;
      done = true;
      child.off("message", onMessage);
      resolve();
    };
    const onMessage = (message: unknown): void => {
      if (signal.aborted) return;
      if (typeof message === "object" && message !== null && "taskshim" in message) {
        if (message.taskshim === "serving") finish();
      }
    };
    child.on("message", onMessage);
    signal.addEventListener("abort", () => child.off("message", onMessage), { once: true });
    if (address === undefined) return;
    void (async () => {
      while (!done && !signal.aborted) {
        // A request in flight when the watch ended may be answered by the next shim: not this one's.
        if ((await healthy(address)) && !signal.aborted) finish();
        else await sleep(POLL_MS, undefined, { signal }).catch(() => undefined);
      }
    })();
  });
}

/** Whether `GET /api/healthcheck` answers 200 (a stand-in's 503 is not a shim serving). */
function healthy({ host, port }: ServeAddress): Promise<boolean> {
  return new Promise((resolve) => {
    const asked = request(
      {
        host: connectHost(host),
        port,
        path: "/api/healthcheck",
        headers: { connection: "close" },
        timeout: ASK_TIMEOUT_MS,
      },
      (response) => {
        response.resume();
        resolve(response.statusCode === 200);
      },
    );
    asked.on("timeout", () => asked.destroy());
    asked.on("error", () => resolve(false));
    asked.end();
  });
}

/** The wildcard addresses are served on loopback too; the healthcheck is asked there. */
function connectHost(host: string): string {
  if (host === "0.0.0.0" || host === "") return "127.0.0.1";
  if (host === "::") return "::1";
  return host;
}
