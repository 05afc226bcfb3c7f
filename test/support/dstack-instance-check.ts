/*
 * A replay of what a release dstack server does to a shim at every instance check, for the
 * components part alone: the rules of `_maybe_install_components`, `_maybe_install_runner` and
 * `_maybe_install_shim` in dstack's
 * src/dstack/_internal/server/background/pipeline_tasks/instances/check.py, and of the
 * `ShimClient` calls they make (src/dstack/_internal/server/services/runner/client.py), written
 * again in TypeScript from their behaviour. Nothing else of the check (health, tasks, GPUs).
 */

/** A component as `GET /api/components` lists it. */
export interface WireComponent {
  readonly name: string;
  readonly version: string;
  readonly status: string;
  readonly build_id?: string;
  readonly error?: string;
}

/** A release server's settings for the components part of its checks. */
export interface ReleaseServer {
  /** `DSTACK_VERSION`: the expected version of both the shim and the runner (a release: e.g. 0.21.3). */
  readonly version: string;
  /** `DSTACK_SHIM_DOWNLOAD_URL`, a template with `{version}` and `{arch}`. */
  readonly shimDownloadUrl: string;
  /** `DSTACK_RUNNER_DOWNLOAD_URL`, likewise. */
  readonly runnerDownloadUrl: string;
  /** The instance's CPU architecture as Go names it (`amd64`, `arm64`). */
  readonly arch?: string;
}

/** Why the check did not ask the shim to restart, in the order the server tests them. */
export type NoRestart =
  | "no installed shim version"
  | "installed version is the running one"
  | "installation requested"
  | "a component is installing"
  | "not safe to restart";

/** What one instance check did. */
export interface CheckRecord {
  /** The running shim's version (`GET /api/healthcheck`). */
  readonly running: string;
  /** `GET /api/components` as the check read it. */
  readonly components: readonly WireComponent[];
  /** The installs it posted, in order. */
  readonly posted: readonly string[];
  /** `POST /api/shutdown {"force": false}` sent, or why not. */
  readonly restart: "requested" | NoRestart;
}

/** A status of the shim's API outside 2xx: dstack's client raises, and the whole check fails. */
export class ShimHttpStatusError extends Error {
  override readonly name = "ShimHttpStatusError";
}

/** `str.format(version=…, arch=…)` of dstack's `_format_download_url`. */
export function downloadUrl(template: string, version: string, arch = "amd64"): string {
  return template.replaceAll("{version}", version).replaceAll("{arch}", arch);
}

/**
 * One instance check's components part against the shim at `shim` (its base URL): reads the
 * running version and the components, posts an install of each component whose version differs
 * from the expected one and is not installing, then asks for a graceful restart only when the
 * installed shim version is known, differs from the running one, no install was posted now, none
 * is running, and every task is `terminated` (the restart-safe statuses at dstack's commit).
 */
export async function instanceCheck(shim: string, server: ReleaseServer): Promise<CheckRecord> {
  const running = (await call<{ version: string }>(shim, "GET", "/api/healthcheck")).version;
  const { components } = await call<{ components: WireComponent[] }>(shim, "GET", "/api/components");
  const posted: string[] = [];
  const runner = components.find((c) => c.name === "dstack-runner");
  const shimInfo = components.find((c) => c.name === "dstack-shim");
  let installationRequested = false;
  const maybeInstall = async (info: WireComponent | undefined, template: string): Promise<void> => {
    if (info === undefined) return;
    if (info.status === "installing") return;
    if (info.version !== "" && info.version === server.version) return;
    const url = downloadUrl(template, server.version, server.arch);
    // A network error is logged and the check goes on (requests.RequestException); an HTTP error
    // status is not caught there and ends the whole check.
    try {
      await call(shim, "POST", "/api/components/install", { name: info.name, url });
    } catch (error) {
      if (error instanceof ShimHttpStatusError) throw error;
      return;
    }
    posted.push(info.name);
    installationRequested = true;
  };
  await maybeInstall(runner, server.runnerDownloadUrl);
  const installedShim = shimInfo?.status === "installed" ? shimInfo.version : undefined;
  await maybeInstall(shimInfo, server.shimDownloadUrl);

  const restart = await (async (): Promise<CheckRecord["restart"]> => {
    if (installedShim === undefined) return "no installed shim version";
    if (installedShim === running) return "installed version is the running one";
    if (installationRequested) return "installation requested";
    if (components.some((c) => c.status === "installing")) return "a component is installing";
    const { tasks } = await call<{ tasks: { status: string }[] }>(shim, "GET", "/api/tasks");
    if (!tasks.every((t) => t.status === "terminated")) return "not safe to restart";
    await call(shim, "POST", "/api/shutdown", { force: false });
    return "requested";
  })();
  return { running, components, posted, restart };
}

async function call<T = unknown>(base: string, method: string, path: string, body?: unknown): Promise<T> {
  const response = await fetch(`${base}${path}`, {
    method,
    signal: AbortSignal.timeout(10_000),
    ...(body === undefined
      ? {}
      : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
  });
  const text = await response.text();
  if (response.status >= 400) {
    throw new ShimHttpStatusError(`${method} ${path}: HTTP ${response.status} ${text.slice(0, 200)}`);
  }
  const json = response.headers.get("content-type")?.includes("json") ?? false;
  return (json ? JSON.parse(text) : text) as T;
}
