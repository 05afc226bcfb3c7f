import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync, readSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/** The built shim every integration test runs, as a real child process. */
export const SHIM_BUNDLE = resolve(import.meta.dirname, "../../dist/taskshim.cjs");

/**
 * What a bundle's shebang sets (`#!/usr/bin/env -S [NAME=value ...] node <flags>`, written by
 * scripts/build.mjs from scripts/node-flags.mjs): the shim runs with them in every launch path,
 * so the tests and benchmarks that start it with `node <bundle>` pass them too. Bundles of
 * earlier releases have flags only.
 */
export function bundleLaunch(bundle: string = SHIM_BUNDLE): { env: Record<string, string>; flags: string[] } {
  const fd = openSync(bundle, "r");
  try {
    const head = Buffer.alloc(512);
    const line = head
      .subarray(0, readSync(fd, head, 0, head.length, 0))
      .toString("latin1")
      .split("\n")[0];
    const match = /^#!\/usr\/bin\/env -S((?: [A-Z_]+=\S*)*) node((?: --[\w=.-]+)*)$/.exec(line ?? "");
    if (!match)
      throw new Error(`${bundle}: no "#!/usr/bin/env -S [NAME=value ...] node" shebang on its first line`);
    const words = (group: string | undefined): string[] => group?.split(" ").filter(Boolean) ?? [];
    const env = Object.fromEntries(
      words(match[1]).map((w) => [w.slice(0, w.indexOf("=")), w.slice(w.indexOf("=") + 1)]),
    );
    return { env, flags: words(match[2]) };
  } finally {
    closeSync(fd);
  }
}

/** The Node.js flags of a bundle's shebang ({@link bundleLaunch}). */
export function bundleNodeFlags(bundle: string = SHIM_BUNDLE): string[] {
  return bundleLaunch(bundle).flags;
}

/**
 * The node arguments of `taskshim upgrade --json` (the build under test's CLI) rolling the shim
 * at `shimUrl` to the binary at `binary.path`, checked by its sha256.
 */
export function upgradeArgv(shimUrl: string, binary: { path: string; sha256: string }): string[] {
  return [
    SHIM_BUNDLE,
    "upgrade",
    "--shim",
    shimUrl,
    "--url",
    `file://${binary.path}`,
    "--sha256",
    binary.sha256,
    "--json",
  ];
}

/** A task as `GET /api/tasks/{id}` returns it. */
export interface TaskInfo {
  id: string;
  status: string;
  termination_reason: string;
  termination_message: string;
  ports: { host: number; container: number }[] | null;
  image_pull_progress: {
    downloaded_bytes: number;
    extracted_bytes: number;
    total_bytes: number;
    is_total_bytes_final: boolean;
  } | null;
  container_name: string;
  container_id: string;
  gpus_ids: string[] | null;
}

/** An HTTP answer: status, raw text and (when JSON) the parsed body. */
export interface Answer<T = unknown> {
  status: number;
  text: string;
  json: T;
  contentType: string;
}

/** A free TCP port on 127.0.0.1. */
export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolvePort(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/** A temp dir for a shim home. */
export async function tempHome(prefix = "taskshim-home-"): Promise<string> {
  return mkdtemp(join(tmpdir(), prefix));
}

/** A small client for a shim's API at `url`; `context()` adds what a failure message shows. */
export class ShimApi {
  constructor(
    readonly url: string,
    protected readonly context: () => string = () => "",
  ) {}

  /** One HTTP request; JSON bodies are sent with `application/json`. */
  async request<T = unknown>(method: string, path: string, body?: unknown): Promise<Answer<T>> {
    const response = await fetch(`${this.url}${path}`, {
      method,
      signal: AbortSignal.timeout(30_000),
      ...(body === undefined
        ? {}
        : {
            body: typeof body === "string" ? body : JSON.stringify(body),
            headers: { "content-type": "application/json" },
          }),
    });
    const text = await response.text();
    let json: unknown = undefined;
    try {
      json = JSON.parse(text);
    } catch {
      // plain text
    }
    return {
      status: response.status,
      text,
      json: json as T,
      contentType: response.headers.get("content-type") ?? "",
    };
  }

  /** Submits a task; throws unless the answer is 200. */
  async submit(config: Record<string, unknown>): Promise<TaskInfo> {
    const answer = await this.request<TaskInfo>("POST", "/api/tasks", config);
    if (answer.status !== 200) throw new Error(`submit failed: ${answer.status} ${answer.text}`);
    return answer.json;
  }

  /** The task, or throws unless 200. */
  async task(id: string): Promise<TaskInfo> {
    const answer = await this.request<TaskInfo>("GET", `/api/tasks/${id}`);
    if (answer.status !== 200) throw new Error(`get task ${id}: ${answer.status} ${answer.text}`);
    return answer.json;
  }

  /** Polls the task until `predicate` holds. */
  async waitTask(
    id: string,
    predicate: (t: TaskInfo) => boolean,
    timeoutMs = 30_000,
    pollMs = 20,
  ): Promise<TaskInfo> {
    const deadline = Date.now() + timeoutMs;
    let last: TaskInfo | undefined;
    while (Date.now() < deadline) {
      last = await this.task(id);
      if (predicate(last)) return last;
      await sleep(pollMs);
    }
    throw new Error(
      `task ${id} did not reach the expected state; last: ${JSON.stringify(last)}\n${this.context()}`,
    );
  }

  /** Waits for a terminal status. */
  waitTerminated(id: string, timeoutMs = 30_000): Promise<TaskInfo> {
    return this.waitTask(id, (t) => t.status === "terminated", timeoutMs);
  }

  /** `POST /api/tasks/{id}/terminate`. */
  terminate(id: string, reason = "terminated_by_user", message = "", timeout = 0): Promise<Answer<TaskInfo>> {
    return this.request<TaskInfo>("POST", `/api/tasks/${id}/terminate`, {
      termination_reason: reason,
      termination_message: message,
      timeout,
    });
  }

  /** `POST /api/tasks/{id}/remove`. */
  remove(id: string): Promise<Answer> {
    return this.request("POST", `/api/tasks/${id}/remove`);
  }
}

/** A shim child process and a small client for its API. */
export class ShimProcess extends ShimApi {
  private output = "";
  private exited: Promise<number | null>;

  private constructor(
    readonly child: ChildProcess,
    readonly home: string,
    readonly port: number,
  ) {
    super(`http://127.0.0.1:${port}`, () => this.output);
    child.stdout?.on("data", (chunk: Buffer) => (this.output += chunk.toString("utf8")));
    child.stderr?.on("data", (chunk: Buffer) => (this.output += chunk.toString("utf8")));
    this.exited = new Promise((resolveExit) => child.once("exit", (code) => resolveExit(code)));
  }

  /** Everything the process printed so far. */
  get logs(): string {
    return this.output;
  }

  /**
   * Starts `taskshim serve` on a home (new temp dir unless given) and waits for the healthcheck.
   * `args` are extra serve flags; `env` extra environment.
   */
  static async start(
    options: {
      home?: string;
      port?: number;
      args?: string[];
      env?: NodeJS.ProcessEnv;
      waitReady?: boolean;
      /** The bundle to run (default {@link SHIM_BUNDLE}). */
      bundle?: string;
      /**
       * A single binary to run instead of a bundle (its Node flags are inside it), with the
       * environment of the bundle's shebang, as deploy/taskshim.service gives it.
       */
      binary?: string;
    } = {},
  ): Promise<ShimProcess> {
    const home = options.home ?? (await tempHome());
    const port = options.port ?? (await freePort());
    const launch = bundleLaunch(options.bundle);
    const serve = ["serve", "--shim-home", home, "--shim-http-port", String(port), ...(options.args ?? [])];
    const [file, args] =
      options.binary !== undefined
        ? [options.binary, serve]
        : [process.execPath, [...launch.flags, options.bundle ?? SHIM_BUNDLE, ...serve]];
    const child = spawn(file, args, {
      env: { ...process.env, ...launch.env, ...options.env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const shim = new ShimProcess(child, home, port);
    if (options.waitReady !== false) await shim.waitReady();
    return shim;
  }

  /** Waits until the healthcheck answers (or the process exits). */
  async waitReady(timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let exitCode: number | null | undefined;
    void this.exited.then((code) => (exitCode = code));
    while (Date.now() < deadline) {
      if (exitCode !== undefined) throw new Error(`shim exited with ${exitCode}:\n${this.output}`);
      try {
        const answer = await this.request("GET", "/api/healthcheck");
        if (answer.status === 200) return;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    throw new Error(`shim not ready within ${timeoutMs} ms:\n${this.output}`);
  }

  /** Waits for the process to exit; returns its exit code. */
  async waitExit(timeoutMs = 15_000): Promise<number | null> {
    const timeout = sleep(timeoutMs).then(() => {
      throw new Error(`shim did not exit within ${timeoutMs} ms:\n${this.output}`);
    });
    return Promise.race([this.exited, timeout]);
  }

  /** SIGKILL, as a crash or `kill -9` would. */
  async kill(): Promise<void> {
    this.child.kill("SIGKILL");
    await this.exited;
  }

  /** Graceful stop through SIGTERM; returns the exit code. */
  async stop(): Promise<number | null> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return this.child.exitCode;
    this.child.kill("SIGTERM");
    return this.waitExit();
  }
}
