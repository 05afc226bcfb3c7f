import { type ChildProcess, execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { openSync, closeSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";

import { expectProgressOk, hasStatusCode, removeImagesOf, testDocker } from "./docker.js";

const execFileAsync = promisify(execFile);

const START_TIMEOUT_MS = 15_000;
const STOP_TIMEOUT_MS = 5_000;
const PUSH_TIMEOUT_MS = 60_000;
const START_ATTEMPTS = 3;

/** A Docker registry (Debian's `docker-registry`, distribution 2.8) serving plain HTTP on 127.0.0.1. */
export interface LocalRegistry {
  /** `127.0.0.1:PORT`: the registry part of image references. */
  readonly host: string;
  readonly username: string;
  readonly password: string;
  /** Temp dir holding the config, the htpasswd file, the log and the storage. */
  readonly dataDir: string;
  /**
   * Push a local image as `host/repo:tag` (with this registry's credentials) and remove that local tag
   * again, so a later pull of the returned reference goes to the registry. The engine still skips layers
   * it already has locally ("Already exists"); push a {@link createUniqueImage} image and remove it to
   * force a real download.
   */
  push(localImage: string, repo: string, tag: string): Promise<string>;
  /**
   * Delete the layer blobs of every tag of `repo` from the storage, keeping manifests and configs: the
   * manifest still resolves, so a pull answers HTTP 200 and then fails mid-stream with an error line
   * (provided the engine does not already have those layers). Blobs are global to the registry, so
   * other repos sharing the layers break too.
   */
  deleteBlobsOf(repo: string): Promise<void>;
  /** Stop the registry (SIGTERM, then SIGKILL) and delete `dataDir`. Idempotent. */
  stop(): Promise<void>;
}

/** Options of {@link startRegistry}; credentials default to `taskshim` and a random password. */
export interface RegistryOptions {
  readonly username?: string;
  readonly password?: string;
}

/**
 * Start a throwaway registry on 127.0.0.1 with htpasswd auth and filesystem storage in a temp dir; resolves
 * once `/v2/` answers 401. The engine treats 127.0.0.0/8 registries as insecure, so plain HTTP works.
 */
export async function startRegistry(options: RegistryOptions = {}): Promise<LocalRegistry> {
  const username = options.username ?? "taskshim";
  const password = options.password ?? randomBytes(12).toString("hex");
  const dataDir = await mkdtemp(join(tmpdir(), "taskshim-registry-"));
  try {
    const { stdout } = await execFileAsync("htpasswd", ["-Bbn", username, password], { timeout: 10_000 });
    await writeFile(join(dataDir, "htpasswd"), stdout.trim() + "\n", { mode: 0o600 });
    let lastError: unknown;
    for (let attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
      const port = await freePort();
      try {
        const child = await serve(dataDir, port);
        return makeRegistry({ host: `127.0.0.1:${port}`, username, password, dataDir, child });
      } catch (err) {
        lastError = err; // most likely the port was taken between freePort() and bind
      }
    }
    throw lastError;
  } catch (err) {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  }
}

async function serve(dataDir: string, port: number): Promise<ChildProcess> {
  const config = {
    version: 0.1,
    log: { level: "warn", accesslog: { disabled: true } },
    storage: {
      filesystem: { rootdirectory: join(dataDir, "storage") },
      delete: { enabled: true },
      maintenance: { uploadpurging: { enabled: false } },
    },
    http: { addr: `127.0.0.1:${port}`, secret: randomBytes(16).toString("hex") },
    auth: { htpasswd: { realm: "taskshim-test", path: join(dataDir, "htpasswd") } },
  };
  // JSON is YAML; no blob descriptor cache, so deleted blobs are noticed at once.
  const configPath = join(dataDir, "config.yml");
  await writeFile(configPath, JSON.stringify(config, null, 2));

  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("REGISTRY_")));
  const logPath = join(dataDir, "registry.log");
  const log = openSync(logPath, "a");
  let child: ChildProcess;
  try {
    child = spawn("docker-registry", ["serve", configPath], { stdio: ["ignore", log, log], env });
  } finally {
    closeSync(log);
  }
  let exited: string | undefined;
  child.once("exit", (code, signal) => (exited = signal ?? `code ${code}`));
  child.once("error", (err) => (exited = err.message));
  const killOnExit = (): void => void child.kill("SIGKILL");
  process.once("exit", killOnExit);
  child.once("exit", () => process.off("exit", killOnExit));

  const deadline = Date.now() + START_TIMEOUT_MS;
  while (Date.now() < deadline) {
    if (exited !== undefined) {
      throw new Error(`docker-registry exited (${exited}) on port ${port}: ${await lastLine(logPath)}`);
    }
    if ((await probe(port)) === 401) return child;
    await sleep(100);
  }
  child.kill("SIGKILL");
  throw new Error(
    `docker-registry did not answer 401 on /v2/ within ${START_TIMEOUT_MS} ms: ${await lastLine(logPath)}`,
  );
}

function makeRegistry(fields: {
  host: string;
  username: string;
  password: string;
  dataDir: string;
  child: ChildProcess;
}): LocalRegistry {
  const { host, username, password, dataDir, child } = fields;
  const docker = testDocker();
  const v2 = join(dataDir, "storage", "docker", "registry", "v2");
  let stopped: Promise<void> | undefined;

  return {
    host,
    username,
    password,
    dataDir,

    async push(localImage, repo, tag) {
      const target = `${host}/${repo}`;
      const ref = `${target}:${tag}`;
      await docker.getImage(localImage).tag({ repo: target, tag });
      try {
        const stream = await docker.getImage(target).push({
          tag,
          authconfig: { username, password, serveraddress: host },
          abortSignal: AbortSignal.timeout(PUSH_TIMEOUT_MS),
        });
        await expectProgressOk(stream, `push ${ref}`);
      } finally {
        try {
          await docker.getImage(ref).remove(); // untag only: localImage still holds the image
        } catch (err) {
          if (!hasStatusCode(err, 404)) throw err; // eslint-disable-line no-unsafe-finally
        }
      }
      return ref;
    },

    async deleteBlobsOf(repo) {
      const tagsDir = join(v2, "repositories", repo, "_manifests", "tags");
      const tags = await readdir(tagsDir).catch(() => [] as string[]);
      const layers = new Set<string>();
      for (const tag of tags) {
        const digest = (await readFile(join(tagsDir, tag, "current", "link"), "utf8")).trim();
        await collectLayers(v2, digest, layers);
      }
      if (layers.size === 0) throw new Error(`registry ${host} has no layers for repo ${repo}`);
      for (const digest of layers) {
        await rm(blobDir(v2, digest), { recursive: true, force: true });
      }
    },

    stop() {
      stopped ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          const exit = new Promise<void>((resolve) => child.once("exit", () => resolve()));
          child.kill("SIGTERM");
          const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
          await exit;
          clearTimeout(timer);
        }
        await rm(dataDir, { recursive: true, force: true });
        await removeImagesOf(host);
      })();
      return stopped;
    },
  };
}

interface ManifestJson {
  readonly layers?: readonly { readonly digest: string }[];
  readonly manifests?: readonly { readonly digest: string }[];
}

/** Add the layer digests of a manifest (following manifest lists / OCI indexes) to `into`. */
async function collectLayers(v2: string, digest: string, into: Set<string>): Promise<void> {
  const manifest = JSON.parse(await readFile(join(blobDir(v2, digest), "data"), "utf8")) as ManifestJson;
  for (const layer of manifest.layers ?? []) into.add(layer.digest);
  for (const child of manifest.manifests ?? []) await collectLayers(v2, child.digest, into);
}

function blobDir(v2: string, digest: string): string {
  const [algorithm, hex] = digest.split(":");
  if (algorithm === undefined || hex === undefined || !/^[a-f0-9]{32,}$/.test(hex)) {
    throw new Error(`unexpected digest ${digest}`);
  }
  return join(v2, "blobs", algorithm, hex.slice(0, 2), hex);
}

/** Status of GET /v2/, or undefined while nothing answers. */
async function probe(port: number): Promise<number | undefined> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/v2/`, { signal: AbortSignal.timeout(1_000) });
    await res.body?.cancel();
    return res.status;
  } catch {
    return undefined;
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => {
        if (address !== null && typeof address === "object") resolve(address.port);
        else reject(new Error("could not get a free port"));
      });
    });
  });
}

async function lastLine(path: string): Promise<string> {
  const text = await readFile(path, "utf8").catch(() => "");
  return (
    text
      .split("\n")
      .map((line) => line.trim())
      .filter(Boolean)
      .at(-1) ?? "(no output)"
  ).slice(0, 300);
}
