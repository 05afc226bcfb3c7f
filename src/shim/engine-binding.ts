/*
 * The start's half of a home bound to its engine (the running half: runner/engine-guard.ts). A
 * start whose engine is not the one the home's containers live on restores nothing against it:
 * every task would be "container not found", its GPUs, keys and volumes released, while its
 * container runs on. It refuses instead, unless the operator moves the home on purpose.
 */
import { ConfigError } from "../config/shim-config.js";
import { DockerodeClient } from "../docker/dockerode-client.js";
import type { EngineEndpoint } from "../docker/engine-endpoint.js";
import { setTimeout as sleep } from "node:timers/promises";
import {
  describeEngine,
  sameEngine,
  type EngineFingerprint,
  type EngineFingerprintSource,
} from "../docker/engine-fingerprint.js";
import { errorMessage } from "../errors/error-message.js";
import { writeEngineRecord, type EngineRecord } from "../state/engine-record.js";

/** A record read back as the fingerprint it holds. */
export function recordedEngine(record: EngineRecord): EngineFingerprint {
  return { kind: record.kind, id: record.id, rootDir: record.rootDir };
}

/** The record of `engine`, reached at `url`, bound now. */
export function engineRecordOf(engine: EngineFingerprint, url: string): EngineRecord {
  return {
    kind: engine.kind,
    id: engine.id,
    rootDir: engine.rootDir,
    url,
    boundAt: new Date().toISOString(),
  };
}

/** How a start stands with the home's engine record. */
export type BindingDecision =
  | { readonly kind: "unbound" }
  | { readonly kind: "same" }
  /** `--engine-url` names another engine and the recorded one runs nothing of this home's. */
  | { readonly kind: "moved"; readonly from: EngineRecord };

/** What a move needs to know of the recorded engine: this home's containers still alive there. */
export type LiveContainers = (record: EngineRecord, homeId: string) => Promise<number>;

/**
 * Decides a start against the home's engine record: the same engine, a deliberate move
 * (`--engine-url` given, and the recorded engine reachable, itself, and running no container of
 * this home), or a refusal.
 *
 * @throws ConfigError (exit 78) naming both engines and what to do.
 */
export async function checkEngineBinding(options: {
  readonly home: string;
  readonly homeId: string;
  readonly record: EngineRecord | undefined;
  readonly current: EngineFingerprint;
  readonly endpoint: EngineEndpoint;
  readonly liveContainers?: LiveContainers;
}): Promise<BindingDecision> {
  const { record, current, endpoint } = options;
  if (record === undefined) return { kind: "unbound" };
  const recorded = recordedEngine(record);
  if (sameEngine(recorded, current)) {
    // The same engine at a new address (a socket moved): the record follows it.
    if (record.url !== endpoint.url) await writeEngineRecord(options.home, { ...record, url: endpoint.url });
    return { kind: "same" };
  }
  const both = `this home's containers live on ${describeEngine(recorded)} at ${record.url}, but ${endpoint.url} is ${describeEngine(current)}`;
  if (endpoint.source !== "engine-url") {
    throw new ConfigError(
      `${both}: start it against ${record.url} (--engine-url), or move the home with --engine-url ${endpoint.url} once no container of it runs there`,
    );
  }
  let live: number;
  try {
    live = await (options.liveContainers ?? liveOnRecordedEngine)(record, options.homeId);
  } catch (error) {
    throw new ConfigError(
      `${both}: the move is refused because the recorded engine cannot be checked for this home's containers (${errorMessage(error)})`,
      { cause: error },
    );
  }
  if (live > 0) {
    throw new ConfigError(
      `${both}: the move is refused because ${live} container(s) of this home still run there; stop them (or start against ${record.url})`,
    );
  }
  await writeEngineRecord(options.home, engineRecordOf(current, endpoint.url));
  return { kind: "moved", from: record };
}

/** Containers of this home on the recorded engine that are not exited (reached at its URL). */
async function liveOnRecordedEngine(record: EngineRecord, homeId: string): Promise<number> {
  const docker = DockerodeClient.fromUrl(record.url);
  const seen = await docker.fingerprint();
  if (!sameEngine(recordedEngine(record), seen)) {
    throw new Error(`${record.url} is now ${describeEngine(seen)}`);
  }
  const containers = await docker.listTaskContainers();
  return containers.filter((c) => c.owner === homeId && c.state !== "exited" && c.state !== "dead").length;
}

/** How long a start keeps asking a slow engine which it is before it gives up. */
export const IDENTIFY_WITHIN_MS = 30_000;
const IDENTIFY_RETRY_MS = 500;

/**
 * The engine's fingerprint at the start, asked again (each ask under the adapter's own deadlines)
 * until it answers or {@link IDENTIFY_WITHIN_MS} pass: an engine that answered the ping but is
 * slow to say what it is (Podman under load takes seconds for `/version`) is waited for, not
 * taken for an unreachable one. Throws the last failure, or the signal's reason.
 */
export async function identifyEngine(
  source: EngineFingerprintSource,
  signal: AbortSignal,
  withinMs = IDENTIFY_WITHIN_MS,
): Promise<EngineFingerprint> {
  const started = performance.now();
  for (;;) {
    try {
      return await source.fingerprint(signal);
    } catch (error) {
      if (signal.aborted || performance.now() - started + IDENTIFY_RETRY_MS > withinMs) throw error;
    }
    await sleep(IDENTIFY_RETRY_MS, undefined, { signal });
  }
}
