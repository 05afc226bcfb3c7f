import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, resolve } from "node:path";
import type { ContainerParams } from "../docker/container-spec.js";
import { checkEngineUrl, EngineUrlError } from "../docker/engine-endpoint.js";
import { DEFAULT_VOLUME_MOUNT_ROOT } from "../host/volumes.js";

/** pino's level names, ordered as logrus' numeric levels 1..6 map to them. */
export type LogLevel = "fatal" | "error" | "warn" | "info" | "debug" | "trace";

/** How stdout shows the log (see `ShimConfig.logFormat`). */
export type LogFormat = "auto" | "text" | "json";
const LOG_FORMATS: readonly LogFormat[] = ["auto", "text", "json"];

/** One validated configuration for `taskshim serve`. */
export interface ShimConfig {
  readonly home: string;
  readonly httpAddress: string;
  readonly httpPort: number;
  /** A file holding the API token; "" = no token required. */
  readonly authTokenFile: string;
  readonly shimBinaryPath: string;
  readonly logLevel: LogLevel;
  /**
   * How stdout shows the log: `text`, one readable line per event, or `json`, pino's lines;
   * `auto` is text on a terminal and JSON to a file, a pipe or journald. shim.log is JSON always.
   */
  readonly logFormat: LogFormat;
  readonly runnerDownloadUrl: string;
  readonly runnerBinaryPath: string;
  readonly runnerHttpPort: number;
  readonly runnerSshPort: number;
  readonly runnerLogLevel: string;
  readonly runnerSshLogLevel: string;
  readonly passEnv: readonly string[];
  readonly privileged: boolean;
  readonly pjrtDevice: string;
  /** Service mode (dstack's SSH fleets): write `<home>/host_info.json` at start (host/host-info.ts). */
  readonly serviceMode: boolean;
  /** dstack-shim's DCGM Exporter port: the exporter the shim runs on NVIDIA hosts listens here. */
  readonly dcgmExporterHttpPort: number;
  /** dstack-shim's DCGM Exporter collect interval, in milliseconds. */
  readonly dcgmExporterIntervalMs: number;
  /** nv-hostengine's address for the GPU health (`dcgmi --host`); "" = the local nv-hostengine. */
  readonly dcgmAddress: string;
  /**
   * Let a `dstack-shim` install replace this taskshim with a binary that is not taskshim (dstack's
   * own shim): off by default, so a server's component check cannot swap the host's agent.
   */
  readonly allowShimHandover: boolean;
  readonly gpuFixture: string;
  readonly volumeMountRoot: string;
  /**
   * Adopt labelled containers that have neither an owner label nor a task.json here (a host
   * migrating from a dstack-shim that wrote no state); by default they are foreign.
   */
  readonly adoptUnowned: boolean;
  /** `GET /api/events` streams open at once; one more is answered 503 (1..900). */
  readonly maxEventStreams: number;
  /**
   * The engine's address (`unix:///path` or `tcp://host:port`), before DOCKER_HOST; "" = not
   * set (DOCKER_HOST, else the first default socket that answers: docker/engine-endpoint.ts).
   */
  readonly engineUrl: string;
  /** Environment-only knobs for tests and chaos runs (see TESTING_ENV). */
  readonly testing: {
    readonly failpoints: string;
    readonly bootIdFile: string;
    readonly passwdFile: string;
    readonly diskByIdDir: string;
    /** Rely on the 1 s list alone (benchmarks measure the safety net this way). */
    readonly noEvents: boolean;
  };
}

/**
 * Environment-only settings that let tests stand in for host facts (a reboot, a user, a disk)
 * and arm failpoints. Their defaults are the real host's.
 */
export const TESTING_ENV = {
  failpoints: "TASKSHIM_FAILPOINTS",
  bootIdFile: "TASKSHIM_BOOT_ID_FILE",
  passwdFile: "TASKSHIM_PASSWD_FILE",
  diskByIdDir: "TASKSHIM_DISK_BY_ID_DIR",
  noEvents: "TASKSHIM_NO_EVENTS",
} as const;

/** A flag or environment value that cannot be used; the message names it. */
export class ConfigError extends Error {
  override readonly name: string = "ConfigError";
}

/**
 * sysexits' EX_CONFIG: the exit status of a configuration error (a {@link ConfigError}), which
 * `supervise` does not restart after (restarting cannot help).
 */
export const EXIT_CONFIG = 78;

/** The serve flags as commander hands them over (all optional strings or booleans). */
export type ServeFlags = Partial<Record<FlagName, string | boolean>>;

/** Mirrors EVENT_STREAM_LIMITS of src/api/event-streams.ts (a test keeps them equal). */
export const DEFAULT_EVENT_STREAMS = 100;
/** 100 of the API's 1,000 connections always stay for everything but event streams. */
export const MAX_EVENT_STREAMS = 900;

/** Every serve setting: its flag (camelCase as commander names it), env variable and default. */
export const SERVE_SETTINGS = {
  shimHome: { flag: "--shim-home <dir>", env: "DSTACK_SHIM_HOME", help: "home dir (shim.log, runners/)" },
  shimHttpAddress: {
    flag: "--shim-http-address <addr>",
    env: "TASKSHIM_HTTP_ADDRESS",
    help: "address to bind (default 127.0.0.1)",
  },
  authTokenFile: {
    flag: "--auth-token-file <file>",
    env: "TASKSHIM_AUTH_TOKEN_FILE",
    help: "require `Authorization: Bearer <token>` (the file's content) on every route but the healthcheck",
  },
  shimHttpPort: {
    flag: "--shim-http-port <port>",
    env: "DSTACK_SHIM_HTTP_PORT",
    help: "HTTP port (default 10998)",
  },
  shimBinaryPath: {
    flag: "--shim-binary-path <path>",
    env: "DSTACK_SHIM_BINARY_PATH",
    help: "target of self-upgrade",
  },
  shimLogLevel: {
    flag: "--shim-log-level <level>",
    env: "DSTACK_SHIM_LOG_LEVEL",
    help: "1..6 or fatal|error|warn|info|debug|trace (default info)",
  },
  logFormat: {
    flag: "--log-format <format>",
    env: "TASKSHIM_LOG_FORMAT",
    help: "stdout log: text (readable lines), json, or auto (text on a terminal, else json; default); shim.log is JSON",
  },
  runnerDownloadUrl: {
    flag: "--runner-download-url <url>",
    env: "DSTACK_RUNNER_DOWNLOAD_URL",
    help: "download the runner at startup if missing",
  },
  runnerBinaryPath: {
    flag: "--runner-binary-path <path>",
    env: "DSTACK_RUNNER_BINARY_PATH",
    help: "runner binary mounted into containers (default /usr/local/bin/dstack-runner)",
  },
  runnerHttpPort: {
    flag: "--runner-http-port <port>",
    env: "DSTACK_RUNNER_HTTP_PORT",
    help: "default 10999",
  },
  runnerSshPort: { flag: "--runner-ssh-port <port>", env: "DSTACK_RUNNER_SSH_PORT", help: "default 10022" },
  runnerLogLevel: {
    flag: "--runner-log-level <level>",
    env: "DSTACK_RUNNER_LOG_LEVEL",
    help: "default info",
  },
  runnerSshLogLevel: { flag: "--runner-ssh-log-level <level>", env: "DSTACK_RUNNER_SSH_LOG_LEVEL", help: "" },
  passEnv: {
    flag: "--pass-env <names>",
    env: "DSTACK_DOCKER_PASS_ENV",
    help: "comma-separated host env vars copied into containers",
  },
  privileged: {
    flag: "--privileged [bool]",
    env: "DSTACK_DOCKER_PRIVILEGED",
    help: "force privileged containers",
  },
  pjrtDevice: { flag: "--pjrt-device <value>", env: "PJRT_DEVICE", help: "PJRT_DEVICE for containers (TPU)" },
  service: {
    flag: "--service [bool]",
    env: "DSTACK_SERVICE_MODE",
    help: "service mode (SSH fleets): write <home>/host_info.json at start",
  },
  dcgmExporterHttpPort: {
    flag: "--dcgm-exporter-http-port <port>",
    env: "DSTACK_DCGM_EXPORTER_HTTP_PORT",
    help: "DCGM Exporter's HTTP port (default 10997)",
  },
  dcgmExporterInterval: {
    flag: "--dcgm-exporter-interval <ms>",
    env: "DSTACK_DCGM_EXPORTER_INTERVAL",
    help: "DCGM Exporter's collect interval in milliseconds (default 5000)",
  },
  dcgmAddress: {
    flag: "--dcgm-address <host>",
    env: "DSTACK_DCGM_ADDRESS",
    help: "nv-hostengine's address for GPU health through dcgmi (default: the local one)",
  },
  allowShimHandover: {
    flag: "--allow-shim-handover [bool]",
    env: "TASKSHIM_ALLOW_SHIM_HANDOVER",
    help: "let a dstack-shim install replace taskshim with a binary that is not taskshim (default false)",
  },
  gpuFixture: {
    flag: "--gpu-fixture <file>",
    env: "TASKSHIM_GPU_FIXTURE",
    help: "describe GPUs from a JSON fixture instead of detecting them (testing)",
  },
  volumeMountRoot: {
    flag: "--volume-mount-root <dir>",
    env: "TASKSHIM_VOLUME_MOUNT_ROOT",
    help: `where network volumes are mounted (default ${DEFAULT_VOLUME_MOUNT_ROOT})`,
  },
  adoptUnowned: {
    flag: "--adopt-unowned [bool]",
    env: "TASKSHIM_ADOPT_UNOWNED",
    help: "adopt labelled containers without owner label and without task state (migrating from a stateless dstack-shim)",
  },
  engineUrl: {
    flag: "--engine-url <url>",
    env: "TASKSHIM_ENGINE_URL",
    help: "the engine's API: unix:///path/to.sock or tcp://host:port (before DOCKER_HOST; default: Docker's socket, else rootful Podman's)",
  },
  maxEventStreams: {
    flag: "--max-event-streams <n>",
    env: "TASKSHIM_MAX_EVENT_STREAMS",
    help: `GET /api/events streams open at once, 1..${MAX_EVENT_STREAMS} (default ${DEFAULT_EVENT_STREAMS}); more are answered 503`,
  },
} as const;

type FlagName = keyof typeof SERVE_SETTINGS;

const DEFAULT_PASS_ENV = "http_proxy,https_proxy,no_proxy,HTTP_PROXY,HTTPS_PROXY,NO_PROXY";
const LOG_LEVELS: readonly LogLevel[] = ["fatal", "error", "warn", "info", "debug", "trace"];

function port(value: string, name: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > 65_535)
    throw new ConfigError(`${name}: invalid port ${JSON.stringify(value)}`);
  return n;
}

function count(value: string, name: string, max: number): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || n < 1 || n > max) {
    throw new ConfigError(`${name}: expected an integer from 1 to ${max}, got ${JSON.stringify(value)}`);
  }
  return n;
}

function milliseconds(value: string, name: string): number {
  const n = Number(value.trim());
  if (!/^\d+$/.test(value.trim()) || n < 1 || n > 86_400_000) {
    throw new ConfigError(`${name}: expected milliseconds from 1 to 86400000, got ${JSON.stringify(value)}`);
  }
  return n;
}

function oneOf<T extends string>(value: string, name: string, allowed: readonly T[]): T {
  const v = value.trim().toLowerCase();
  if ((allowed as readonly string[]).includes(v)) return v as T;
  throw new ConfigError(`${name}: expected one of ${allowed.join(", ")}, got ${JSON.stringify(value)}`);
}

function bool(value: string | boolean, name: string): boolean {
  if (typeof value === "boolean") return value;
  const v = value.trim().toLowerCase();
  // Go's strconv.ParseBool spellings (t, f) too: dstack-shim's environment is read with it.
  if (["1", "t", "true", "yes", "on"].includes(v)) return true;
  if (["", "0", "f", "false", "no", "off"].includes(v)) return false;
  throw new ConfigError(`${name}: expected a boolean, got ${JSON.stringify(value)}`);
}

function engineUrl(value: string): string {
  if (value.trim() === "") return "";
  try {
    return checkEngineUrl(value);
  } catch (error) {
    if (error instanceof EngineUrlError)
      throw new ConfigError(`engine-url: ${error.message}`, { cause: error });
    throw error;
  }
}

/** Maps a logrus level (a digit 1..6 or a name) to pino's. */
export function parseLogLevel(value: string): LogLevel {
  const v = value.trim().toLowerCase();
  if (/^[0-6]$/.test(v)) return LOG_LEVELS[Math.max(0, Number(v) - 1)] ?? "info";
  if (v === "warning") return "warn";
  if (v === "panic") return "fatal";
  if ((LOG_LEVELS as readonly string[]).includes(v)) return v as LogLevel;
  throw new ConfigError(`invalid log level ${JSON.stringify(value)}`);
}

/**
 * Resolves the configuration: a flag beats its environment variable, which beats the
 * default. Throws `ConfigError` naming the first bad value.
 */
export function resolveShimConfig(
  flags: ServeFlags,
  env: NodeJS.ProcessEnv = process.env,
  defaults: { shimBinaryPath: string } = { shimBinaryPath: process.execPath },
): ShimConfig {
  const get = (name: FlagName): string | boolean | undefined => {
    const flag = flags[name];
    if (flag !== undefined) return flag;
    return env[SERVE_SETTINGS[name].env];
  };
  const str = (name: FlagName, fallback: string): string => {
    const v = get(name);
    return typeof v === "string" && v !== "" ? v : fallback;
  };
  const path = (name: FlagName, fallback: string): string => {
    const v = str(name, fallback);
    return isAbsolute(v) ? v : resolve(v);
  };
  const runnerLogLevel = str("runnerLogLevel", "info");
  parseLogLevel(runnerLogLevel);
  return {
    home: path("shimHome", resolve(homedir(), ".dstack")),
    httpAddress: str("shimHttpAddress", "127.0.0.1"),
    httpPort: port(str("shimHttpPort", "10998"), SERVE_SETTINGS.shimHttpPort.env),
    authTokenFile: str("authTokenFile", "") === "" ? "" : path("authTokenFile", ""),
    shimBinaryPath: path("shimBinaryPath", defaults.shimBinaryPath),
    logLevel: parseLogLevel(str("shimLogLevel", "info")),
    logFormat: oneOf(str("logFormat", "auto"), "log-format", LOG_FORMATS),
    runnerDownloadUrl: str("runnerDownloadUrl", ""),
    runnerBinaryPath: path("runnerBinaryPath", "/usr/local/bin/dstack-runner"),
    runnerHttpPort: port(str("runnerHttpPort", "10999"), SERVE_SETTINGS.runnerHttpPort.env),
    runnerSshPort: port(str("runnerSshPort", "10022"), SERVE_SETTINGS.runnerSshPort.env),
    runnerLogLevel,
    runnerSshLogLevel: str("runnerSshLogLevel", ""),
    passEnv: str("passEnv", DEFAULT_PASS_ENV)
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean),
    privileged: bool(get("privileged") ?? false, "privileged"),
    pjrtDevice: str("pjrtDevice", ""),
    serviceMode: bool(get("service") ?? false, "service"),
    dcgmExporterHttpPort: port(str("dcgmExporterHttpPort", "10997"), SERVE_SETTINGS.dcgmExporterHttpPort.env),
    dcgmExporterIntervalMs: milliseconds(
      str("dcgmExporterInterval", "5000"),
      SERVE_SETTINGS.dcgmExporterInterval.env,
    ),
    dcgmAddress: str("dcgmAddress", ""),
    allowShimHandover: bool(get("allowShimHandover") ?? false, "allow-shim-handover"),
    gpuFixture: str("gpuFixture", ""),
    volumeMountRoot: path("volumeMountRoot", DEFAULT_VOLUME_MOUNT_ROOT),
    adoptUnowned: bool(get("adoptUnowned") ?? false, "adopt-unowned"),
    maxEventStreams: count(
      str("maxEventStreams", String(DEFAULT_EVENT_STREAMS)),
      "max-event-streams",
      MAX_EVENT_STREAMS,
    ),
    engineUrl: engineUrl(str("engineUrl", "")),
    testing: {
      failpoints: env[TESTING_ENV.failpoints] ?? "",
      bootIdFile: env[TESTING_ENV.bootIdFile] || "/proc/sys/kernel/random/boot_id",
      passwdFile: env[TESTING_ENV.passwdFile] || "/etc/passwd",
      diskByIdDir: env[TESTING_ENV.diskByIdDir] || "/dev/disk/by-id",
      noEvents: bool(env[TESTING_ENV.noEvents] ?? false, TESTING_ENV.noEvents),
    },
  };
}

/**
 * What every task container is built from, per this configuration: the dstack-runner settings, the
 * `--pass-env` variables set in `env`, and whether the host has InfiniBand devices.
 */
export function containerParamsOf(config: ShimConfig, env: NodeJS.ProcessEnv = process.env): ContainerParams {
  return {
    runnerBinaryPath: config.runnerBinaryPath,
    runnerHttpPort: config.runnerHttpPort,
    runnerSshPort: config.runnerSshPort,
    runnerLogLevel: config.runnerLogLevel,
    runnerSshLogLevel: config.runnerSshLogLevel,
    baseEnv: config.passEnv.flatMap((name) => {
      const value = env[name];
      return value === undefined ? [] : [`${name}=${value}`];
    }),
    privileged: config.privileged,
    pjrtDevice: config.pjrtDevice,
    volumeMountRoot: config.volumeMountRoot,
    infiniband: existsSync("/dev/infiniband"),
  };
}
