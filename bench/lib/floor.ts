import { execFile, spawn } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { transform } from "esbuild";
import { bundleLaunch } from "../../test/support/shim-process.js";
import { firstAnswer } from "./first-answer.js";

const execFileAsync = promisify(execFile);

/** The floor process's source (bench/b3-floor.ts): Node.js builtins only. */
export const FLOOR_SOURCE = resolve(import.meta.dirname, "../b3-floor.ts");

/**
 * Writes the floor as plain CommonJS (`<dir>/b3-floor.cjs`) and returns its path. Compiled here,
 * once, because Node's own stripping of a `.ts` entry costs ~50 ms of every start (its TypeScript
 * transformer is loaded first) and its ES module loader ~30 ms more than CommonJS: costs the
 * shim's bundle (CommonJS) does not pay, so the floor must not either.
 */
export async function compileFloor(dir: string): Promise<string> {
  const { code } = await transform(await readFile(FLOOR_SOURCE, "utf8"), {
    loader: "ts",
    format: "cjs",
    platform: "node",
  });
  const path = join(dir, "b3-floor.cjs");
  await writeFile(path, code);
  return path;
}

/** What the floor process prints once it has answered: its marks in ms since it started. */
export interface FloorMarks {
  /** The script's first line ran: Node.js started, its http, fs and path loaded. */
  readonly script: number;
  readonly listed: number;
  readonly read: number;
  readonly listening: number;
  readonly answered: number;
  /** task.json files read. */
  readonly files: number;
}

/** One run of the floor: spawn → its first answer (B3's client), the answer, and its own marks. */
export interface FloorRun {
  readonly ms: number;
  readonly tasks: ReadonlyMap<string, string>;
  readonly marks: FloorMarks;
}

/** Where one floor run reads and answers. */
export interface FloorTarget {
  /** The engine's URL (`unix:///path` or `tcp://host:port`). */
  readonly engineUrl: string;
  /** The shim home whose task dirs it reads. */
  readonly home: string;
  readonly port: number;
}

/**
 * Spawns the compiled floor (`script`, from {@link compileFloor}) and times spawn → its first
 * answer of `GET /api/tasks`, polled as B3 polls the restarted shim. The process is killed if it
 * is still there at the end (an error on the way).
 */
export async function runFloor(script: string, target: FloorTarget, timeoutMs = 10_000): Promise<FloorRun> {
  let output = "";
  const started = performance.now();
  const child = spawn(process.execPath, [script, target.engineUrl, target.home, String(target.port)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  // "close", not "exit": the marks are on stdout, which may still be draining at "exit".
  const closed = new Promise<number | null>((done) => child.once("close", (code) => done(code)));
  child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString("utf8")));
  child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString("utf8")));
  try {
    const first = await firstAnswer(
      {
        child,
        url: `http://127.0.0.1:${target.port}`,
        get logs() {
          return output;
        },
      },
      timeoutMs,
    );
    const code = await Promise.race([closed, sleep(5_000).then(() => "did not exit within 5 s")]);
    if (code !== 0) throw new Error(`floor process: ${String(code)}:\n${output}`);
    const last = output.trim().split("\n").at(-1) ?? "";
    return { ms: first.at - started, tasks: first.tasks, marks: JSON.parse(last) as FloorMarks };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
}

/** Wall times (ms) of `taskshim --version`, as a bundle and as a single binary, and of `node -e 0`, round by round. */
export interface VersionPairs {
  /** `node <flags> <bundle> --version`. */
  readonly version: readonly number[];
  /** `<binary> --version`, where a binary was given. */
  readonly binary?: readonly number[];
  readonly bare: readonly number[];
}

/**
 * `rounds` interleaved rounds of `node <flags> <bundle> --version` (the bundle's shebang's flags
 * and environment: how `npx taskshim --version` starts), of `<binary> --version` if given (the
 * single binary an operator installs) and of `node -e 0`, each spawned and waited for the same
 * way; the order within a round rotates, so no side always runs on the cache another warmed.
 */
export async function timeVersionPairs(
  bundle: string,
  rounds: number,
  binary?: string,
): Promise<VersionPairs> {
  const launch = bundleLaunch(bundle);
  const timed = async (file: string, args: string[], env: NodeJS.ProcessEnv): Promise<number> => {
    const started = performance.now();
    const { stdout } = await execFileAsync(file, args, { env });
    const ms = performance.now() - started;
    if (args.includes("--version") && !/\d+\.\d+\.\d+/.test(stdout))
      throw new Error(
        `${file === process.execPath ? bundle : file} --version printed ${JSON.stringify(stdout)}`,
      );
    return ms;
  };
  const env = { ...process.env, ...launch.env };
  const sides = [
    {
      times: [] as number[],
      run: () => timed(process.execPath, [...launch.flags, bundle, "--version"], env),
    },
    { times: [] as number[], run: () => timed(process.execPath, ["-e", "0"], process.env) },
    ...(binary !== undefined
      ? [{ times: [] as number[], run: () => timed(binary, ["--version"], env) }]
      : []),
  ];
  for (let round = 0; round < rounds; round++) {
    for (let i = 0; i < sides.length; i++) {
      const side = sides[(round + i) % sides.length];
      if (side) side.times.push(await side.run());
    }
  }
  const [version, bare, ofBinary] = sides.map((side) => side.times);
  return { version: version ?? [], bare: bare ?? [], ...(ofBinary ? { binary: ofBinary } : {}) };
}
