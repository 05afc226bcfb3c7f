import { setTimeout as sleep } from "node:timers/promises";
import { liveMembers } from "./stale-exporter.js";

/*
 * The exporter's process: the wrapper it runs under, its process group and its output. Apart
 * from the supervisor's state machine, which only decides when to start and stop it.
 */

/**
 * The wrapper: runs the exporter ("$@") in the background, and SIGTERMs it when its own stdin (a
 * pipe from the shim) ends, which is when the shim exits or dies, or when the wrapper itself gets
 * SIGTERM (the stop). It waits until the exporter has really exited (a trapped signal interrupts
 * `wait`), so the exporter stays its child and is reaped, and exits with its status. fd 3 keeps the
 * pipe: an asynchronous list's stdin is /dev/null in a non-interactive sh.
 */
export const EXPORTER_WRAPPER = [
  "exec 3<&0",
  '"$@" 3<&- </dev/null &',
  "child=$!",
  `trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP`,
  '( read -r _ <&3; kill -TERM "$child" 2>/dev/null ) &',
  "watcher=$!",
  "exec 3<&-",
  "status=0",
  "while :; do",
  '  wait "$child"; status=$?',
  '  kill -0 "$child" 2>/dev/null || break',
  "done",
  'kill "$watcher" 2>/dev/null',
  'exit "$status"',
].join("\n");

/** Keeps the last bytes of a stream: the exporter's last words when it dies. */
export class Tail {
  private text = "";
  constructor(private readonly max: number) {}
  push(chunk: Buffer): void {
    this.text = (this.text + chunk.toString("utf8")).slice(-this.max);
  }
  lastLine(): string {
    return (
      this.text
        .split("\n")
        .map((l) => l.trim())
        .filter(Boolean)
        .at(-1) ?? ""
    );
  }
}

/** Signals a process group; a group already gone is fine. */
export function signalGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * Waits until no live process of the group is left, up to `ms`. A zombie is not live: one whose
 * parent died is reparented, and an init that does not reap (a container's) would keep it forever.
 */
export async function groupGone(pgid: number, ms: number): Promise<boolean> {
  const deadline = performance.now() + ms;
  while (signalGroup(pgid, 0) && (await liveMembers(pgid)).length > 0) {
    if (performance.now() >= deadline) return false;
    await sleep(50);
  }
  return true;
}

/** The body of `response` as text, refused beyond `cap` bytes. */
export async function readCapped(response: Response, cap: number): Promise<string> {
  if (response.body === null) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  // Leaving the loop early (the throw) cancels the stream.
  for await (const chunk of response.body as AsyncIterable<Uint8Array>) {
    size += chunk.byteLength;
    if (size > cap) throw new Error(`the answer is larger than ${cap} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}
