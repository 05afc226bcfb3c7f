import type { ChildProcess } from "node:child_process";
import { finished, type Readable, type Writable } from "node:stream";

/*
 * What a bounded run captured of one child: its exit, a failure to wait for it, each pipe's end
 * and the first bytes of its output. The runner (run-bounded.ts) decides when to stop waiting;
 * the cleanup (cleanup-evidence.ts) kills what this watches and reports what it saw.
 */

/** A bounded output collector: keeps the first `cap` bytes, drains the rest. */
class Collector {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly cap: number) {}
  push(chunk: Buffer): void {
    // Stryker disable next-line ConditionalExpression,EqualityOperator: a full collector has room 0 and keeps an empty slice.
    if (this.size >= this.cap) return;
    const room = this.cap - this.size;
    // Stryker disable next-line ConditionalExpression,EqualityOperator: a slice of room bytes of a chunk no longer than room is the chunk.
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.chunks.push(kept);
    this.size += kept.length;
  }
  take(): Buffer {
    return Buffer.concat(this.chunks, this.size);
  }
}

/** A timer as a promise, with its cancel: the runner's bound and the cleanup's graces. */
export function after(ms: number): { promise: Promise<"timeout">; cancel: () => void } {
  let timer: NodeJS.Timeout | undefined;
  const promise = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), ms);
  });
  return { promise, cancel: () => clearTimeout(timer) };
}

/** One of the child's three pipes. */
export type PipeName = "stdin" | "stdout" | "stderr";

/** One pipe of the child: settled when it ended, with its error if it failed. */
interface PipeEnd {
  readonly name: PipeName;
  readonly ended: Promise<void>;
  error: Error | null;
}

/** Everything observed about one child: its exit, a failure to wait for it, and each pipe's end. */
export class ChildWatch {
  /** Settles when the child exited: its code, or the signal that killed it. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** An `error` event after a successful spawn: Node could not wait for or signal the child. */
  readonly waitFailed: Promise<Error>;
  /** Whether the child was reaped (its `exit` came). */
  reaped = false;
  /** The first bytes of stdout, up to the cap; the rest was drained and dropped. */
  readonly stdout: Collector;
  /** The first bytes of stderr, up to the cap; the rest was drained and dropped. */
  readonly stderr: Collector;
  private readonly pipes: PipeEnd[] = [];

  constructor(
    readonly child: ChildProcess,
    stdin: string | Buffer | undefined,
    /** Output kept per stream, so a chatty child cannot exhaust memory. */
    outputCapBytes: number,
  ) {
    this.stdout = new Collector(outputCapBytes);
    this.stderr = new Collector(outputCapBytes);
    this.exited = new Promise((resolve) =>
      child.once("exit", (code, signal) => {
        this.reaped = true;
        resolve({ code, signal });
      }),
    );
    this.waitFailed = new Promise((resolve) => child.on("error", resolve));
    if (stdin !== undefined && child.stdin) {
      const pipe = this.watch("stdin", child.stdin, { readable: false });
      // Never awaited on its own: the write settles by itself, an EPIPE included.
      pipe.end(stdin);
    }
    if (child.stdout) this.watchOutput("stdout", child.stdout, this.stdout);
    if (child.stderr) this.watchOutput("stderr", child.stderr, this.stderr);
  }

  private watch<S extends Readable | Writable>(
    name: PipeName,
    stream: S,
    options: { readonly readable?: false; readonly writable?: false },
  ): S {
    const end: { -readonly [K in keyof PipeEnd]: PipeEnd[K] } = {
      name,
      ended: Promise.resolve(),
      error: null,
    };
    end.ended = new Promise((resolve) =>
      finished(stream, options, (error) => {
        end.error = error ?? null;
        resolve();
      }),
    );
    this.pipes.push(end);
    return stream;
  }

  private watchOutput(name: PipeName, stream: Readable, into: Collector): void {
    this.watch(name, stream, { writable: false }).on("data", (chunk: Buffer) => into.push(chunk));
  }

  /** Settles once every pipe has ended: EOF or error on the outputs, the write done on stdin. */
  ioFinished(): Promise<"io-finished"> {
    return Promise.all(this.pipes.map((p) => p.ended)).then(() => "io-finished" as const);
  }

  /** The error a pipe ended with, once it ended. */
  errorOf(name: PipeName): Error | null {
    return this.pipes.find((p) => p.name === name)?.error ?? null;
  }

  /** Stops reading and writing, once a cleanup gave up waiting for the pipes. */
  abandonPipes(): void {
    this.child.stdin?.destroy();
    this.child.stdout?.destroy();
    this.child.stderr?.destroy();
  }
}
