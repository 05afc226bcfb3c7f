/*
 * The engine's own calls: ping, which engine answers (`GET /version`), and where it keeps its
 * data (`GET /info`). The engine detected last is kept here, for the families whose calls differ
 * by engine (a create with GPUs, a stop, a pull).
 */
import { DOCKER_DEADLINES, type EngineCalls } from "./engine-calls.js";
import { fingerprintOf, type EngineFingerprint } from "./engine-fingerprint.js";
import { parseEngineVersion, type EngineDetection, type EngineInfo } from "./engine-info.js";

/** dockerode's calls that take an abort signal which its types do not declare. */
type SignalledCall = (opts: { abortSignal: AbortSignal }) => Promise<unknown>;

/** Ping, version and info over one {@link EngineCalls}, and the engine last detected. */
export class EngineSystem {
  /** The engine as last detected. */
  private detected: EngineInfo | undefined;

  constructor(private readonly calls: EngineCalls) {}

  /** The engine as last detected; undefined before the first detection. */
  get engine(): EngineInfo | undefined {
    return this.detected;
  }

  /** The engine as last detected, or detected now if it is not known yet. */
  async known(signal: AbortSignal | undefined): Promise<EngineInfo> {
    return this.detected ?? (await this.detectEngine(signal)).info;
  }

  /** `GET /_ping`. */
  async ping(signal?: AbortSignal): Promise<void> {
    // @types/dockerode lacks ping's options, but dockerode honours `abortSignal` there too.
    const ping = this.calls.docker.ping.bind(this.calls.docker) as unknown as SignalledCall;
    await this.calls.call("ping", DOCKER_DEADLINES.ping, signal, (abortSignal) => ping({ abortSignal }));
  }

  /** `GET /version`, read as which engine this is; the answer is kept for the calls that follow. */
  async detectEngine(signal?: AbortSignal): Promise<EngineDetection> {
    // @types/dockerode lacks version's options, but dockerode honours `abortSignal` there too.
    const version = this.calls.docker.version.bind(this.calls.docker) as unknown as SignalledCall;
    const body = await this.calls.call("version", DOCKER_DEADLINES.version, signal, (abortSignal) =>
      version({ abortSignal }),
    );
    const detection = parseEngineVersion(body);
    this.detected = detection.info;
    return detection;
  }

  /** `GET /info`, as the engine answers it. */
  private async info(signal?: AbortSignal): Promise<unknown> {
    // @types/dockerode lacks info's options, but dockerode honours `abortSignal` there too.
    const info = this.calls.docker.info.bind(this.calls.docker) as unknown as SignalledCall;
    return this.calls.call("info", DOCKER_DEADLINES.info, signal, (abortSignal) => info({ abortSignal }));
  }

  /** Which engine instance answers here (engine-fingerprint.ts): `/version`'s kind, `/info`'s identity. */
  async fingerprint(signal?: AbortSignal): Promise<EngineFingerprint> {
    const [detection, info] = await Promise.all([this.detectEngine(signal), this.info(signal)]);
    return fingerprintOf(detection.info.kind, info);
  }
}
