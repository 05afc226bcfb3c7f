import { homedir } from "node:os";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import {
  ConfigError,
  containerParamsOf,
  DEFAULT_EVENT_STREAMS,
  parseLogLevel,
  resolveShimConfig,
  type ServeFlags,
} from "./shim-config.js";

const DEFAULTS = { shimBinaryPath: "/opt/taskshim/bin/taskshim" };
const config = (flags: ServeFlags = {}, env: NodeJS.ProcessEnv = {}) =>
  resolveShimConfig(flags, env, DEFAULTS);

describe("resolveShimConfig: defaults", () => {
  it("matches dstack-shim's defaults and binds to localhost", () => {
    const c = config();
    expect(c.httpAddress).toBe("127.0.0.1");
    expect(c.httpPort).toBe(10998);
    expect(c.runnerHttpPort).toBe(10999);
    expect(c.runnerSshPort).toBe(10022);
    expect(c.home).toBe(resolve(homedir(), ".dstack"));
    expect(c.logLevel).toBe("info");
    expect(c.runnerLogLevel).toBe("info");
    expect(c.runnerSshLogLevel).toBe("");
    expect(c.runnerBinaryPath).toBe("/usr/local/bin/dstack-runner");
    expect(c.runnerDownloadUrl).toBe("");
    expect(c.shimBinaryPath).toBe("/opt/taskshim/bin/taskshim");
    expect(c.passEnv).toEqual([
      "http_proxy",
      "https_proxy",
      "no_proxy",
      "HTTP_PROXY",
      "HTTPS_PROXY",
      "NO_PROXY",
    ]);
    expect(c.privileged).toBe(false);
    expect(c.serviceMode).toBe(false);
    expect(c.pjrtDevice).toBe("");
  });

  it("does not read process.env when an env is given", () => {
    const saved = process.env.DSTACK_SHIM_HTTP_PORT;
    process.env.DSTACK_SHIM_HTTP_PORT = "4321";
    try {
      expect(config().httpPort).toBe(10998);
    } finally {
      if (saved === undefined) delete process.env.DSTACK_SHIM_HTTP_PORT;
      else process.env.DSTACK_SHIM_HTTP_PORT = saved;
    }
  });
});

describe("resolveShimConfig: precedence", () => {
  it("a flag beats its env variable, which beats the default", () => {
    const env = {
      DSTACK_SHIM_HTTP_PORT: "3000",
      DSTACK_SHIM_HOME: "/env/home",
      DSTACK_SHIM_LOG_LEVEL: "error",
    };
    expect(config({}, env)).toMatchObject({ httpPort: 3000, home: "/env/home", logLevel: "error" });
    expect(
      config({ shimHttpPort: "2000", shimHome: "/flag/home", shimLogLevel: "trace" }, env),
    ).toMatchObject({
      httpPort: 2000,
      home: "/flag/home",
      logLevel: "trace",
    });
  });

  it("reads every dstack-shim env variable", () => {
    const c = config(
      {},
      {
        DSTACK_SHIM_BINARY_PATH: "/usr/local/bin/dstack-shim",
        DSTACK_RUNNER_DOWNLOAD_URL: "https://example.com/runner",
        DSTACK_RUNNER_BINARY_PATH: "/opt/runner",
        DSTACK_RUNNER_HTTP_PORT: "11999",
        DSTACK_RUNNER_SSH_PORT: "11022",
        DSTACK_RUNNER_LOG_LEVEL: "5",
        DSTACK_RUNNER_SSH_LOG_LEVEL: "VERBOSE",
        PJRT_DEVICE: "TPU",
        DSTACK_SERVICE_MODE: "1",
        TASKSHIM_HTTP_ADDRESS: "0.0.0.0",
      },
    );
    expect(c).toMatchObject({
      shimBinaryPath: "/usr/local/bin/dstack-shim",
      runnerDownloadUrl: "https://example.com/runner",
      runnerBinaryPath: "/opt/runner",
      runnerHttpPort: 11999,
      runnerSshPort: 11022,
      runnerLogLevel: "5",
      runnerSshLogLevel: "VERBOSE",
      pjrtDevice: "TPU",
      serviceMode: true,
      httpAddress: "0.0.0.0",
    });
  });

  it("resolves a relative home to an absolute path", () => {
    expect(config({ shimHome: "rel/home" }).home).toBe(resolve("rel/home"));
  });
});

describe("resolveShimConfig: log levels", () => {
  it("maps DSTACK_SHIM_LOG_LEVEL=5 (what the server sends) to debug", () => {
    expect(config({}, { DSTACK_SHIM_LOG_LEVEL: "5" }).logLevel).toBe("debug");
  });

  it.each([
    ["0", "fatal"],
    ["1", "fatal"],
    ["2", "error"],
    ["3", "warn"],
    ["4", "info"],
    ["5", "debug"],
    ["6", "trace"],
    ["panic", "fatal"],
    ["warning", "warn"],
    ["WARN", "warn"],
    [" Debug ", "debug"],
  ])("parseLogLevel(%j) is %s", (input, level) => {
    expect(parseLogLevel(input)).toBe(level);
  });

  it.each(["7", "-1", "loud", "55", "1.0"])("rejects the log level %j", (input) => {
    expect(() => parseLogLevel(input)).toThrow(ConfigError);
    expect(() => config({}, { DSTACK_SHIM_LOG_LEVEL: input })).toThrow(ConfigError);
  });

  it("validates the runner log level at startup", () => {
    expect(() => config({}, { DSTACK_RUNNER_LOG_LEVEL: "chatty" })).toThrow(ConfigError);
  });
});

describe("resolveShimConfig: ports", () => {
  it.each(["0", "65536", "abc", "80a", "-1", "1.5", "1e3", " 80", "0x50"])("rejects the port %j", (value) => {
    expect(() => config({}, { DSTACK_SHIM_HTTP_PORT: value })).toThrow(ConfigError);
    expect(() => config({}, { DSTACK_SHIM_HTTP_PORT: value })).toThrow(/DSTACK_SHIM_HTTP_PORT/);
    expect(() => config({ runnerSshPort: value })).toThrow(ConfigError);
  });

  it("accepts the edges of the port range", () => {
    expect(config({ shimHttpPort: "1" }).httpPort).toBe(1);
    expect(config({ shimHttpPort: "65535" }).httpPort).toBe(65535);
  });
});

describe("resolveShimConfig: booleans", () => {
  it.each([
    ["false", false],
    ["0", false],
    ["", false],
    ["no", false],
    ["1", true],
    ["true", true],
    ["TRUE", true],
    ["yes", true],
    // Go's strconv.ParseBool, which dstack-shim reads its environment with.
    ["t", true],
    ["F", false],
  ])("DSTACK_DOCKER_PRIVILEGED=%j gives %s", (value, expected) => {
    expect(config({}, { DSTACK_DOCKER_PRIVILEGED: value }).privileged).toBe(expected);
  });

  it("rejects a value that is not a boolean", () => {
    expect(() => config({}, { DSTACK_DOCKER_PRIVILEGED: "maybe" })).toThrow(ConfigError);
    expect(() => config({}, { DSTACK_SERVICE_MODE: "2" })).toThrow(ConfigError);
  });

  it("a bare --privileged flag beats the env variable, and so does --privileged false", () => {
    expect(config({ privileged: true }, { DSTACK_DOCKER_PRIVILEGED: "false" }).privileged).toBe(true);
    expect(config({ privileged: "false" }, { DSTACK_DOCKER_PRIVILEGED: "true" }).privileged).toBe(false);
    expect(config({ service: true }).serviceMode).toBe(true);
  });

  it("--adopt-unowned is off by default, set by the flag or TASKSHIM_ADOPT_UNOWNED", () => {
    expect(config({}).adoptUnowned).toBe(false);
    expect(config({ adoptUnowned: true }).adoptUnowned).toBe(true);
    expect(config({}, { TASKSHIM_ADOPT_UNOWNED: "1" }).adoptUnowned).toBe(true);
    expect(() => config({}, { TASKSHIM_ADOPT_UNOWNED: "perhaps" })).toThrow(ConfigError);
  });
});

describe("resolveShimConfig: --max-event-streams", () => {
  it("defaults to the event streams' own limit, takes the flag over TASKSHIM_MAX_EVENT_STREAMS", () => {
    expect(config({}).maxEventStreams).toBe(DEFAULT_EVENT_STREAMS);
    expect(config({}, { TASKSHIM_MAX_EVENT_STREAMS: "500" }).maxEventStreams).toBe(500);
    expect(config({ maxEventStreams: "7" }, { TASKSHIM_MAX_EVENT_STREAMS: "500" }).maxEventStreams).toBe(7);
  });

  it("refuses 0, more than 900 and what is not an integer, naming the setting", () => {
    for (const bad of ["0", "901", "-1", "1.5", "many"]) {
      expect(() => config({ maxEventStreams: bad })).toThrow(
        /^max-event-streams: expected an integer from 1 to 900/,
      );
    }
  });
});

describe("resolveShimConfig: --engine-url", () => {
  it("is unset by default, and takes the flag over TASKSHIM_ENGINE_URL", () => {
    expect(config({}).engineUrl).toBe("");
    expect(config({}, { TASKSHIM_ENGINE_URL: "unix:///run/podman/podman.sock" }).engineUrl).toBe(
      "unix:///run/podman/podman.sock",
    );
    expect(
      config({ engineUrl: "tcp://127.0.0.1:2375" }, { TASKSHIM_ENGINE_URL: "unix:///run/podman/podman.sock" })
        .engineUrl,
    ).toBe("tcp://127.0.0.1:2375");
  });

  it("does not read DOCKER_HOST (the engine choice weighs it at startup)", () => {
    expect(config({}, { DOCKER_HOST: "tcp://127.0.0.1:2375" }).engineUrl).toBe("");
  });

  it("refuses a URL that is neither unix:///path nor tcp://host:port, naming the setting", () => {
    for (const bad of ["/var/run/docker.sock", "http://127.0.0.1:2375", "tcp://host"]) {
      const attempt = () => config({ engineUrl: bad });
      expect(attempt).toThrow(ConfigError);
      expect(attempt).toThrow(/^engine-url: engine URL ".*": expected unix:\/\/\//);
    }
  });
});

describe("resolveShimConfig: pass-env", () => {
  it("splits on commas, trims and drops empty names", () => {
    expect(config({}, { DSTACK_DOCKER_PASS_ENV: " FOO, BAR ,,BAZ," }).passEnv).toEqual(["FOO", "BAR", "BAZ"]);
  });

  it("takes the flag over the env variable", () => {
    expect(config({ passEnv: "ONLY_THIS" }, { DSTACK_DOCKER_PASS_ENV: "FOO,BAR" }).passEnv).toEqual([
      "ONLY_THIS",
    ]);
  });
});

describe("containerParamsOf", () => {
  it("carries the runner settings and passes only the --pass-env variables that are set", () => {
    const c = config({ runnerHttpPort: "11999", passEnv: "HTTP_PROXY,NO_PROXY", privileged: true });
    const params = containerParamsOf(c, { HTTP_PROXY: "http://proxy:3128", OTHER: "x" });
    expect(params).toMatchObject({
      runnerBinaryPath: "/usr/local/bin/dstack-runner",
      runnerHttpPort: 11999,
      runnerSshPort: 10022,
      runnerLogLevel: "info",
      baseEnv: ["HTTP_PROXY=http://proxy:3128"],
      privileged: true,
      volumeMountRoot: c.volumeMountRoot,
    });
  });
});

describe("resolveShimConfig: dstack-shim's DCGM settings and the shim handover", () => {
  it("has dstack-shim's defaults: exporter on 10997 every 5000 ms, libdcgm embedded, no handover", () => {
    const c = config();
    expect([c.dcgmExporterHttpPort, c.dcgmExporterIntervalMs, c.dcgmAddress]).toEqual([10997, 5000, ""]);
    expect(c.allowShimHandover).toBe(false);
  });

  it("takes them from dstack-shim's variables, and a flag beats its variable", () => {
    const env = {
      DSTACK_DCGM_EXPORTER_HTTP_PORT: "11997",
      DSTACK_DCGM_EXPORTER_INTERVAL: "1000",
      DSTACK_DCGM_ADDRESS: "localhost",
      TASKSHIM_ALLOW_SHIM_HANDOVER: "1",
    };
    const c = config({ dcgmExporterInterval: "250" }, env);
    expect([c.dcgmExporterHttpPort, c.dcgmExporterIntervalMs, c.dcgmAddress]).toEqual([
      11997,
      250,
      "localhost",
    ]);
    expect(c.allowShimHandover).toBe(true);
  });

  it.each([
    [{ DSTACK_DCGM_EXPORTER_HTTP_PORT: "0" }, /DSTACK_DCGM_EXPORTER_HTTP_PORT: invalid port "0"/],
    [{ DSTACK_DCGM_EXPORTER_INTERVAL: "5s" }, /DSTACK_DCGM_EXPORTER_INTERVAL: expected milliseconds/],
    [{ DSTACK_DCGM_EXPORTER_INTERVAL: "0" }, /DSTACK_DCGM_EXPORTER_INTERVAL: expected milliseconds/],
    [{ TASKSHIM_ALLOW_SHIM_HANDOVER: "sure" }, /allow-shim-handover: expected a boolean/],
  ])("refuses %j with a line naming it", (env, message) => {
    expect(() => config({}, env)).toThrow(message);
  });
});
